// Command store measures the host's page store (hostd/pagestore) against
// the per-layer files it replaces: 16 sandboxes from one template, each
// taking 10 rolling snapshots, and the bytes on disk of their memory layers
// before (every layer a plain memsnap file, as warren-hostd kept them) and
// after (the layers in the store: chunks once per namespace, reference
// files, and the layers the daemon leaves out of it).
//
// The workload runs the real writer and store, not VMs: a template memory
// image of --mem-mib MiB (a --used fraction of its pages non-zero, each a
// mix of random and repetitive 64-byte lines, so zstd compresses it about
// as much as a booted Linux guest's), one template layer, then for each
// sandbox a copy of it that, between snapshots, rewrites --dirty of its
// pages (half in a hot set of its own that it rewrites every time, half
// anywhere). Each snapshot is taken as warren-hostd's rolling snapshots
// are (rolling.go): a tenant without a key, a full layer, then
// incremental ones on it until the chain has --keep layers, then a full
// one again, every layer but the newest going into the store once the
// next is written; a tenant with a key, full layers only, each into its
// keyed namespace (chunks sealed) as soon as it is written. With 10
// snapshots and the daemon's keep of 8 no rolling snapshot is deleted.
//
// "Before" is what the layer files took on disk (for the keyed tenant,
// sealed whole by hostd/crypt, as before the store); "after" is the
// store's chunk and reference files, plus the layers left plain (the
// template's, and each plain sandbox's newest). Both are given as file
// bytes and as allocated blocks (du). It also times, per layer, the
// ingest (and for the keyed tenant the sealing it replaces: the whole layer
// through crypt.EncryptFile), and per snapshot the rebuild of its chain
// from the store that a resume or rollback now does (pagestore
// Materialize) against a hard link of the plain files (what it did), with
// p50/p90/p99 side by side.
//
//	go run ./bench/store [--mem-mib 256] [--sandboxes 16] [--snapshots 10] [--keep 8] [--dir DIR] [--json FILE] [--png FILE]
//
// --png draws the bytes on disk before and after per tenant; --replot
// draws it from earlier runs' --json files (of either kind, each PATH or
// LABEL=PATH, one bar group each) without running anything:
//
//	go run ./bench/store --replot --png store.png a.json "real guests=b.json"
//
// With --hostd, real guests through warren-hostd instead (daemon.go; needs
// /dev/kvm, and in the nested KVM host runs there):
//
//	bench-store --hostd bin/warren-hostd --warren bin/warren --kernel build/vmlinux --initramfs build/initramfs.cpio [--tenants plain,keyed]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/bench/synthmem"
	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/memsnap"
)

const pageSize = 4096

type config struct {
	MemMiB    int     `json:"mem_mib"`
	Used      float64 `json:"used"`
	Dirty     float64 `json:"dirty"`
	Sandboxes int     `json:"sandboxes"`
	Snapshots int     `json:"snapshots"`
	Keep      int     `json:"keep"`
	// ChunkPages is the layers' chunk size in pages (the store's
	// granularity); RunPages the length of the runs of contiguous pages
	// the guest rewrites (1: single pages scattered over memory).
	ChunkPages int `json:"chunk_pages"`
	RunPages   int `json:"run_pages"`
}

// usage is bytes of files and their allocated blocks.
type usage struct {
	Files     int   `json:"files"`
	Bytes     int64 `json:"bytes"`
	Allocated int64 `json:"allocated"`
}

func (u *usage) addFile(path string) {
	fi, err := os.Stat(path)
	if err != nil {
		return
	}
	u.Files++
	u.Bytes += fi.Size()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		u.Allocated += st.Blocks * 512
	}
}

func (u *usage) add(v usage) {
	u.Files += v.Files
	u.Bytes += v.Bytes
	u.Allocated += v.Allocated
}

// result is one tenant kind's run.
type result struct {
	Tenant      string          `json:"tenant"`
	Before      usage           `json:"before"`
	After       usage           `json:"after"`
	Template    usage           `json:"template"`
	Chunks      usage           `json:"chunks"`
	Refs        usage           `json:"refs"`
	PlainLayers usage           `json:"plain_layers"`
	Ingest      stats.Summary   `json:"ingest"`
	Seal        stats.Summary   `json:"seal_whole_layer,omitzero"`
	Rebuild     stats.Summary   `json:"rebuild_chain"`
	Link        stats.Summary   `json:"link_chain"`
	Store       pagestore.Stats `json:"store_stats"`
	// ObjectStore is the fleet's object store's share of a bundle of
	// each snapshot and of the template (plain tenant only: a key
	// changes the blobs' names, not which are shared).
	ObjectStore *objectStore `json:"object_store,omitempty"`
}

func main() {
	var cfg config
	var dir, jsonOut string
	flag.IntVar(&cfg.MemMiB, "mem-mib", 256, "guest memory of the template, MiB")
	flag.Float64Var(&cfg.Used, "used", 0.45, "fraction of the template's pages that are not zero")
	flag.Float64Var(&cfg.Dirty, "dirty", 0.015, "fraction of pages a sandbox rewrites between two snapshots")
	flag.IntVar(&cfg.Sandboxes, "sandboxes", 16, "sandboxes from the template")
	flag.IntVar(&cfg.Snapshots, "snapshots", 10, "rolling snapshots per sandbox")
	flag.IntVar(&cfg.Keep, "keep", 8, "layers in a chain before a new full snapshot (warren-hostd's default)")
	flag.IntVar(&cfg.ChunkPages, "chunk-pages", memsnap.DefaultChunkPages, "pages per chunk of the layers written")
	flag.IntVar(&cfg.RunPages, "run-pages", 16, "the guest rewrites runs of this many contiguous pages (1: scattered pages)")
	flag.StringVar(&dir, "dir", "", "working directory (default: a new temporary one, removed after)")
	var dr daemonRun
	flag.StringVar(&dr.hostd, "hostd", "", "measure real guests through this warren-hostd binary instead (needs /dev/kvm, --kernel, --initramfs)")
	flag.StringVar(&dr.warren, "warren", "bin/warren", "with --hostd: the warren binary its VMMs run")
	flag.StringVar(&dr.kernel, "kernel", "build/vmlinux", "with --hostd: the guest kernel")
	flag.StringVar(&dr.initramfs, "initramfs", "build/initramfs.cpio", "with --hostd: the guest initramfs (in the kernel's directory)")
	encrypted := flag.String("tenants", "plain,keyed", "with --hostd: which tenants to run (plain, keyed)")
	stats.JSONFlag(&jsonOut)
	var png string
	flag.StringVar(&png, "png", "", "also draw the bytes on disk before and after, per tenant, into this PNG")
	replot := flag.Bool("replot", false, "draw --png from the JSON files given as arguments (earlier runs' --json, each PATH or LABEL=PATH), run nothing")
	flag.Parse()
	if *replot {
		if png == "" || flag.NArg() == 0 {
			fmt.Fprintln(os.Stderr, "bench/store: --replot needs --png and JSON files")
			os.Exit(2)
		}
		check(replotStore(png, flag.Args()))
		return
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "bench-store-")
		check(err)
		defer os.RemoveAll(d)
		dir = d
	}
	if dr.hostd != "" {
		fmt.Printf("real guests through warren-hostd: template %d MiB, %d sandboxes x %d snapshots (a full one every %d)\n\n", cfg.MemMiB, cfg.Sandboxes, cfg.Snapshots, cfg.Keep)
		var rs []daemonResult
		for _, t := range strings.Split(*encrypted, ",") {
			r := dr
			r.encrypted = t == "keyed"
			for _, p := range []*string{&r.hostd, &r.warren, &r.kernel, &r.initramfs} {
				abs, err := filepath.Abs(*p)
				check(err)
				*p = abs
			}
			res := runDaemon(cfg, r, filepath.Join(dir, t))
			printDaemon(res)
			rs = append(rs, res)
			if jsonOut != "" {
				daemonJSON(jsonOut, cfg, rs)
			}
		}
		if png != "" {
			check(writeStorePlot(png, []storeRun{daemonRunOf("", rs)}))
		}
		return
	}
	fmt.Printf("template %d MiB (%.0f%% of pages non-zero), %d sandboxes x %d rolling snapshots (keep %d), %.1f%% of pages rewritten between snapshots in runs of %d pages, chunks of %d pages\n\n",
		cfg.MemMiB, 100*cfg.Used, cfg.Sandboxes, cfg.Snapshots, cfg.Keep, 100*cfg.Dirty, cfg.RunPages, cfg.ChunkPages)
	tmpl := templateMemory(cfg)
	var results []result
	for _, keyed := range []bool{false, true} {
		r := run(cfg, tmpl, filepath.Join(dir, map[bool]string{false: "plain", true: "keyed"}[keyed]), keyed)
		print(r)
		results = append(results, r)
	}
	if jsonOut != "" {
		b, err := json.MarshalIndent(map[string]any{"config": cfg, "results": results}, "", "  ")
		check(err)
		check(os.WriteFile(jsonOut, b, 0o644))
	}
	if png != "" {
		check(writeStorePlot(png, []storeRun{storeRunOf("", cfg, results)}))
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/store:", err)
		os.Exit(1)
	}
}

// fillPage writes a page of mixed random and repetitive 64-byte lines.
func fillPage(pg []byte, r *rand.Rand) { synthmem.Fill(pg, r) }

// templateMemory is the template's memory image.
func templateMemory(cfg config) []byte { return synthmem.Image(cfg.MemMiB, cfg.Used, 1) }

func run(cfg config, tmpl []byte, dir string, keyed bool) result {
	res := result{Tenant: map[bool]string{false: "plain (no key)", true: "keyed (at-rest encryption)"}[keyed]}
	check(os.MkdirAll(dir, 0o700))
	st, err := pagestore.Open(filepath.Join(dir, "pagestore"))
	check(err)
	var ns *pagestore.Namespace
	var key crypt.Key
	if keyed {
		prov := &crypt.LocalProvider{Dir: filepath.Join(dir, "keys")}
		check(os.MkdirAll(prov.Dir, 0o700))
		key, err = prov.Create("acme")
		check(err)
		ns, err = st.Keyed(context.Background(), "acme", prov)
	} else {
		ns, err = st.Plain("acme")
	}
	check(err)
	opts := memsnap.Options{Fingerprint: []byte("bench-host"), ChunkPages: cfg.ChunkPages}
	tdir := filepath.Join(dir, "template")
	check(os.MkdirAll(tdir, 0o700))
	tl, err := memsnap.WriteBase(filepath.Join(tdir, "snap.1"+memsnap.Ext), bytes.NewReader(tmpl), uint64(len(tmpl)), opts)
	check(err)
	tl.Close()
	res.Template.addFile(tl.Path())
	res.Before.add(res.Template)
	var obj *objectStore
	if !keyed {
		obj = &objectStore{}
		res.ObjectStore = obj
		obj.upload(tl.Path())
	}
	// The template's layer into the store as warren-hostd puts it
	// (hostd/daemon templatepages.go): a keyed tenant's in place, its
	// reference file sealed; a plain tenant's beside, the layer kept as
	// a cache (Template, not counted in After).
	if keyed {
		_, err := ns.Ingest(tl.Path())
		check(err)
		check(crypt.EncryptFile(tl.Path(), tl.Path(), key))
	} else {
		ref := filepath.Join(tdir, pagestore.CacheRefDir, filepath.Base(tl.Path()))
		check(os.MkdirAll(filepath.Dir(ref), 0o700))
		check(os.Link(tl.Path(), ref))
		_, err := ns.Ingest(ref)
		check(err)
	}

	var ingest, seal, rebuild, link []time.Duration
	pages := len(tmpl) / pageSize
	mem := make([]byte, len(tmpl))
	for sb := range cfg.Sandboxes {
		copy(mem, tmpl)
		r := rand.New(rand.NewPCG(uint64(sb)+100, 2))
		dirty := make([]uint64, (pages+63)/64)
		runs := max(1, int(float64(pages)*cfg.Dirty/2)/cfg.RunPages) // runs rewritten per interval, in each half
		hot := make([]int, runs)
		for i := range hot {
			hot[i] = r.IntN(pages - cfg.RunPages + 1)
		}
		rewrite := func(first int) {
			for p := first; p < first+cfg.RunPages; p++ {
				fillPage(mem[p*pageSize:(p+1)*pageSize], r)
				dirty[p/64] |= 1 << (p % 64)
			}
		}
		sdir := filepath.Join(dir, fmt.Sprintf("sb-%02d", sb))
		check(os.MkdirAll(sdir, 0o700))
		var parent *memsnap.Layer
		var layers []string // this sandbox's layers, oldest first
		var bases []bool    // whether each is a full one
		chain := 0
		for snap := range cfg.Snapshots {
			// The guest runs: its hot set and as many pages anywhere.
			for _, p := range hot {
				rewrite(p)
			}
			for range len(hot) {
				rewrite(r.IntN(pages - cfg.RunPages + 1))
			}
			path := filepath.Join(sdir, fmt.Sprintf("roll-%06d.1%s", snap+1, memsnap.Ext))
			var l *memsnap.Layer
			if keyed || chain == 0 || chain >= cfg.Keep {
				l, err = memsnap.WriteBase(path, bytes.NewReader(mem), uint64(len(mem)), opts)
				chain = 1
			} else {
				l, err = memsnap.WriteIncremental(path, bytes.NewReader(mem), uint64(len(mem)), dirty, parent, opts)
				chain++
			}
			check(err)
			if obj != nil {
				// The bundle of this snapshot: its memory flattened into
				// one full layer, as an export writes it.
				full := path
				if l.Kind() != memsnap.KindBase {
					full = filepath.Join(sdir, ".bundle"+memsnap.Ext)
					fl, err := memsnap.WriteBase(full, bytes.NewReader(mem), uint64(len(mem)), opts)
					check(err)
					fl.Close()
				}
				obj.upload(full)
				if full != path {
					os.Remove(full)
				}
			}
			clear(dirty)
			if parent != nil {
				parent.Close()
			}
			parent = l
			layers = append(layers, path)
			bases = append(bases, l.Kind() == memsnap.KindBase)
			if keyed {
				// Before: the layer sealed whole (timed on a copy).
				t := time.Now()
				check(crypt.EncryptFile(path+".sealed", path, key))
				seal = append(seal, time.Since(t))
				res.Before.addFile(path + ".sealed")
				os.Remove(path + ".sealed")
				t = time.Now()
				_, err := ns.Ingest(path)
				check(err)
				check(crypt.EncryptFile(path, path, key)) // the reference file, sealed as the daemon does
				ingest = append(ingest, time.Since(t))
				continue
			}
			res.Before.addFile(path)
			if len(layers) > 1 { // the previous one: no VMM chains on it now
				t := time.Now()
				_, err := ns.Ingest(layers[len(layers)-2])
				check(err)
				ingest = append(ingest, time.Since(t))
			}
		}
		parent.Close()
		// A restore of each snapshot: its chain rebuilt from the store
		// (what a resume or rollback now does first) against hard links of
		// the plain files (what it did: a keyed tenant's were decrypted
		// instead, which the rebuild includes for it).
		for i := range layers {
			rebuild = append(rebuild, restoreChain(ns, layers, bases, i, sdir, true))
			link = append(link, restoreChain(ns, layers, bases, i, sdir, false))
		}
	}
	s, err := ns.Stats(dir)
	check(err)
	res.Store = s
	filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil
		}
		switch {
		case filepath.Dir(p) == tdir && !keyed: // the template's cache
		case filepath.Ext(p) == memsnap.Ext && pagestore.IsRefFile(p), keyed && filepath.Ext(p) == memsnap.Ext:
			res.Refs.addFile(p)
		case filepath.Ext(p) == memsnap.Ext:
			res.PlainLayers.addFile(p)
		case filepath.Base(filepath.Dir(filepath.Dir(p))) == "chunks":
			res.Chunks.addFile(p)
		}
		return nil
	})
	res.After.add(res.Chunks)
	res.After.add(res.Refs)
	res.After.add(res.PlainLayers)
	res.Ingest = stats.Summarise("ingest", ingest)
	if keyed {
		res.Seal = stats.Summarise("seal whole", seal)
	}
	res.Rebuild = stats.Summarise("from store", rebuild)
	res.Link = stats.Summarise("plain files", link)
	return res
}

// restoreChain makes a working copy of snapshot i's chain (its layer and
// the layers under it, back to the last full one) and times it: rebuilt
// from the store, or hard links of plain files.
func restoreChain(ns *pagestore.Namespace, layers []string, bases []bool, i int, sdir string, fromStore bool) time.Duration {
	work, err := os.MkdirTemp(sdir, ".work-")
	check(err)
	defer os.RemoveAll(work)
	t := time.Now()
	for j := i; j >= 0; j-- {
		src := layers[j]
		dst := filepath.Join(work, filepath.Base(src))
		if fromStore && (pagestore.IsRefFile(src) || ns.Keyed()) {
			check(ns.Materialize(src, dst, -1))
		} else {
			check(os.Link(src, dst))
		}
		if bases[j] {
			break
		}
	}
	return time.Since(t)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func print(r result) {
	fmt.Printf("== %s ==\n", r.Tenant)
	fmt.Printf("%-34s %14s %14s %8s\n", "bytes on disk", "before", "after", "ratio")
	row := func(name string, b, a int64) {
		fmt.Printf("%-34s %14s %14s %8.2f\n", name, mib(b), mib(a), float64(b)/float64(max(a, 1)))
	}
	row("memory layers (file bytes)", r.Before.Bytes, r.After.Bytes)
	row("memory layers (allocated, du)", r.Before.Allocated, r.After.Allocated)
	fmt.Printf("  before: %d layer files (template %s)\n", r.Before.Files, mib(r.Template.Bytes))
	fmt.Printf("  after:  %d chunks %s, %d reference files %s, %d plain layers %s (the template's layer in the store)\n",
		r.Chunks.Files, mib(r.Chunks.Bytes), r.Refs.Files, mib(r.Refs.Bytes), r.PlainLayers.Files, mib(r.PlainLayers.Bytes))
	if !strings.HasPrefix(r.Tenant, "keyed") {
		fmt.Printf("  and the template's cache, while it is kept: %s (after with it: %s, ratio %.2f)\n", mib(r.Template.Bytes),
			mib(r.After.Bytes+r.Template.Bytes), float64(r.Before.Bytes)/float64(max(r.After.Bytes+r.Template.Bytes, 1)))
	}
	fmt.Printf("  store: logical %s in %d reference files naming %d chunks (%d distinct)\n\n",
		mib(r.Store.LogicalBytes), r.Store.Refs, r.Store.ChunkRefs, r.Store.Chunks)
	if r.Seal.Name != "" {
		stats.Table(os.Stdout, "per layer: into the store (and its reference file sealed) vs sealed whole", r.Ingest, r.Seal)
	} else {
		fmt.Printf("per layer: into the store (%d layers): p50 %v p90 %v p99 %v\n", len(r.Ingest.Samples),
			stats.Significant(r.Ingest.P50), stats.Significant(r.Ingest.P90), stats.Significant(r.Ingest.P99))
	}
	fmt.Println()
	stats.Table(os.Stdout, "per restore: working copy of the snapshot's chain, rebuilt from the store vs hard links", r.Rebuild, r.Link)
	fmt.Println()
	if o := r.ObjectStore; o != nil {
		fmt.Printf("fleet object store: %d bundles (every snapshot's, the template's), memory %s in all\n", o.Bundles, mib(o.Logical))
		fmt.Printf("%-34s %8s %8s %14s %8s\n", "bundles' memory cut", "pieces", "blobs", "stored", "ratio")
		for _, v := range []struct {
			name string
			p    pieces
		}{{"every 4 MiB (version 1)", o.V1}, {"at its chunks (version 2)", o.V2}} {
			fmt.Printf("%-34s %8d %8d %14s %8.2f\n", v.name, v.p.Pieces, v.p.Blobs, mib(v.p.Stored), float64(o.Logical)/float64(max(v.p.Stored, 1)))
		}
		fmt.Printf("  version 2 keeps %.2fx less than version 1\n\n", float64(o.V1.Stored)/float64(max(o.V2.Stored, 1)))
	}
}
