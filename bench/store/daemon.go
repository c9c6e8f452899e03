package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/memsnap"
)

// The same measurement with real guests, through warren-hostd (--hostd):
// a template of the kernel and initramfs (--kernel, --initramfs: files of
// one directory, the daemon's --guest-dir; --mem-mib), --sandboxes
// sandboxes of it, and --snapshots rounds in which every sandbox runs a
// command that rewrites 1 MiB of a file in its RAM file system
// (/tmp/wN, N the round modulo 3) and then takes a snapshot as a rolling
// one would be (the first and every --keep-th full, the others
// incremental; for a tenant with a key, --encrypted, the daemon takes
// them full). "Before" is the layer files as the VMM wrote them (each
// snapshot's recorded bytes, and the template's layer), what warren-hostd
// kept before the store; "after" is GET /v1/store's stored bytes and the
// allocated blocks of the store and the layer files. Snapshot latency
// (the API call, ingest included) is timed too.
type daemonRun struct {
	hostd, warren, kernel, initramfs string
	encrypted                        bool
}

// daemonResult is a daemon run's figures.
type daemonResult struct {
	Tenant            string           `json:"tenant"`
	Sandboxes         int              `json:"sandboxes"`
	Snapshots         int              `json:"snapshots"`
	BeforeBytes       int64            `json:"before_bytes"`
	TemplateBytes     int64            `json:"template_layer_bytes"`
	Store             wire.StoreStats  `json:"store"`
	AllocatedAfter    int64            `json:"allocated_after"`
	SnapshotLatency   stats.Summary    `json:"snapshot_latency"`
	FullLatency       stats.Summary    `json:"full_snapshot_latency"`
	IncrementalLayers map[string]int64 `json:"layer_bytes_by_kind"`
}

func runDaemon(cfg config, r daemonRun, dir string) daemonResult {
	ctx := context.Background()
	state, sock := filepath.Join(dir, "state"), filepath.Join(dir, "hostd.sock")
	check(os.MkdirAll(state, 0o700))
	args := []string{"--state", state, "--socket", sock, "--warren", r.warren, "--cgroup-root", "none",
		"--stop-on-exit", "--guest-dir", filepath.Dir(r.kernel)}
	if r.encrypted {
		keys := filepath.Join(dir, "keys")
		check(os.MkdirAll(keys, 0o700))
		args = append(args, "--keys", keys, "--decrypt-dir", filepath.Join(dir, "decrypted"))
	}
	logf, err := os.Create(filepath.Join(dir, "hostd.log"))
	check(err)
	defer logf.Close()
	cmd := exec.Command(r.hostd, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	check(cmd.Start())
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
		}
	}()
	c, err := client.New(sock, "bench", "")
	check(err)
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if _, err := c.Sandboxes(ctx); err == nil {
			break
		} else if time.Since(start) > 30*time.Second {
			check(fmt.Errorf("warren-hostd does not answer: %w", err))
		}
	}
	res := daemonResult{Tenant: "plain (no key)", Sandboxes: cfg.Sandboxes, Snapshots: cfg.Snapshots, IncrementalLayers: map[string]int64{}}
	if r.encrypted {
		_, err := c.CreateKey(ctx)
		check(err)
		res.Tenant = "keyed (at-rest encryption)"
	}
	tp, err := c.CreateTemplate(ctx, wire.TemplateRequest{Kernel: filepath.Base(r.kernel), Initramfs: filepath.Base(r.initramfs),
		MemMiB: cfg.MemMiB, CPUs: 1}, nil)
	check(err)
	ls, _ := filepath.Glob(tp.Snapshot + ".*" + memsnap.Ext)
	for _, l := range ls {
		fi, err := os.Stat(l)
		check(err)
		res.TemplateBytes += fi.Size()
	}
	res.BeforeBytes = res.TemplateBytes
	fmt.Printf("template %s: layer %s\n", tp.ID, mib(res.TemplateBytes))
	var ids []string
	for range cfg.Sandboxes {
		sb, err := c.Create(ctx, wire.SandboxRequest{Template: tp.ID}, nil)
		check(err)
		ids = append(ids, sb.ID)
	}
	fmt.Printf("%d sandboxes running\n", len(ids))
	var all, full []time.Duration
	for round := range cfg.Snapshots {
		for _, id := range ids {
			script := fmt.Sprintf("head -c 1048576 /dev/urandom > /tmp/w%d", round%3)
			if _, err := c.Exec(ctx, id, wire.ExecRequest{Argv: []string{"sh", "-c", script}}, io.Discard, io.Discard); err != nil {
				check(fmt.Errorf("%s: exec: %w", id, err))
			}
			t := time.Now()
			s, err := c.Snapshot(ctx, id, wire.SnapshotRequest{Name: fmt.Sprintf("roll-%06d", round+1), Incremental: round%cfg.Keep != 0})
			check(err)
			d := time.Since(t)
			all = append(all, d)
			if s.Kind == "full" {
				full = append(full, d)
			}
			res.BeforeBytes += s.Bytes
			res.IncrementalLayers[s.Kind] += s.Bytes
		}
		fmt.Printf("round %d: %d snapshots\n", round+1, len(ids))
	}
	res.SnapshotLatency = stats.Summarise("snapshot", all)
	res.FullLatency = stats.Summarise("full", full)
	// Let the sweeps and ingests settle, then ask.
	time.Sleep(2 * time.Second)
	res.Store, err = c.Store(ctx)
	check(err)
	filepath.WalkDir(state, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil
		}
		if strings.Contains(p, string(filepath.Separator)+"pagestore"+string(filepath.Separator)) || filepath.Ext(p) == memsnap.Ext {
			if fi, err := de.Info(); err == nil {
				res.AllocatedAfter += fi.Sys().(*syscall.Stat_t).Blocks * 512
			}
		}
		return nil
	})
	return res
}

func printDaemon(r daemonResult) {
	fmt.Printf("\n== real guests through warren-hostd, %s: %d sandboxes x %d snapshots ==\n", r.Tenant, r.Sandboxes, r.Snapshots)
	fmt.Printf("%-40s %14s %14s %8s\n", "bytes on disk", "before", "after", "ratio")
	fmt.Printf("%-40s %14s %14s %8.2f\n", "memory layers (file bytes)", mib(r.BeforeBytes), mib(r.Store.StoredBytes),
		float64(r.BeforeBytes)/float64(max(r.Store.StoredBytes, 1)))
	fmt.Printf("%-40s %14s %14s\n", "  allocated (du) after", "", mib(r.AllocatedAfter))
	kinds := make([]string, 0, len(r.IncrementalLayers))
	for k := range r.IncrementalLayers {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Printf("  before: %s layers %s\n", k, mib(r.IncrementalLayers[k]))
	}
	fmt.Printf("  before: template layer %s\n", mib(r.TemplateBytes))
	for _, n := range r.Store.Namespaces {
		fmt.Printf("  after (%s): %d layers in the store (logical %s) as %d chunks %s + reference files %s; plain layers %d, %s; caches %d, %s\n",
			n.Namespace, n.Refs, mib(n.LogicalBytes), n.Chunks, mib(n.ChunkBytes), mib(n.RefBytes), n.Layers, mib(n.LayerBytes), n.Caches, mib(n.CacheBytes))
	}
	if r.Store.CacheBytes > 0 {
		fmt.Printf("  and the caches rebuilt from the store (the template's layer and flattened image), while kept: %s\n", mib(r.Store.CacheBytes))
	}
	fmt.Printf("snapshot API call (ingest of the previous layer included): p50 %v p90 %v p99 %v; full ones p50 %v\n",
		stats.Significant(r.SnapshotLatency.P50), stats.Significant(r.SnapshotLatency.P90), stats.Significant(r.SnapshotLatency.P99),
		stats.Significant(r.FullLatency.P50))
}

// daemonJSON writes the daemon runs' results.
func daemonJSON(path string, cfg config, rs []daemonResult) {
	b, err := json.MarshalIndent(map[string]any{"config": cfg, "daemon_results": rs}, "", "  ")
	check(err)
	check(os.WriteFile(path, b, 0o644))
}
