package objstore

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/bench/synthmem"
	"github.com/warrenvm/warren/fleet/fleettest"
	"github.com/warrenvm/warren/fleet/objstore"
	"github.com/warrenvm/warren/memsnap"
)

// The workload: bench/store's template (256 MiB, 45 % of pages used) and
// one snapshot of a sandbox of it that rewrote 1.5 % of its pages in runs
// of 16.
const (
	memMiB   = 256
	used     = 0.45
	dirty    = 0.015
	runPages = 16
	runs     = 15
	// bundleChunk and memoryGroupMin are hostd/daemon's.
	bundleChunk    = 4 << 20
	memoryGroupMin = memsnap.DefaultChunkPages * memsnap.DefaultPageSize
)

// version is one way to cut a bundle's memory.
type version struct {
	Name string `json:"name"`
	cuts func(l *memsnap.Layer) []int64
}

var versions = []version{
	{"v1 every 4 MiB", func(l *memsnap.Layer) []int64 { return []int64{0, l.FileSize()} }},
	{"v2 at chunks", func(l *memsnap.Layer) []int64 { return l.ChunkCuts(memoryGroupMin) }},
	// Not what hostd/daemon does: groups of four chunks, for the
	// requests a coarser cut saves against the bytes it stores.
	{"1 MiB groups", func(l *memsnap.Layer) []int64 { return l.ChunkCuts(4 * memoryGroupMin) }},
}

// bundle is a tar of layer file's bytes cut at cuts, each piece cut
// again every bundleChunk bytes, as hostd/daemon's bundleWriter does.
func bundle(t *testing.T, file []byte, cuts []int64) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(cuts); i++ {
		for off := cuts[i]; off < cuts[i+1]; off += bundleChunk {
			b := file[off:min(off+bundleChunk, cuts[i+1])]
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("memory/%016x", off), Size: int64(len(b)), Mode: 0o600}); err != nil {
				t.Fatal(err)
			}
			tw.Write(b)
		}
	}
	tw.Close()
	return buf.Bytes()
}

// files counts the files of tar b.
func files(b []byte) int {
	n := 0
	for tr := tar.NewReader(bytes.NewReader(b)); ; n++ {
		if _, err := tr.Next(); err != nil {
			return n
		}
	}
}

// layer writes mem as a full memsnap layer in dir and returns it, opened,
// with its bytes.
func layer(t *testing.T, dir, name string, mem []byte) (*memsnap.Layer, []byte) {
	l, err := memsnap.WriteBase(filepath.Join(dir, name+memsnap.Ext), bytes.NewReader(mem), uint64(len(mem)), memsnap.Options{Created: time.Unix(1e9, 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	b, err := os.ReadFile(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	return l, b
}

// result is one version's figures.
type result struct {
	Version       string        `json:"version"`
	Template      stats.Summary `json:"put_template"`
	Snapshot      stats.Summary `json:"put_snapshot"`
	Get           stats.Summary `json:"get_snapshot"`
	GetCached     stats.Summary `json:"get_snapshot_template_cached"`
	TemplateFiles int           `json:"template_files"`
	SnapshotFiles int           `json:"snapshot_files"`
	Blobs         int           `json:"blobs_per_tenant"`
	Stored        int64         `json:"stored_bytes_per_tenant"`
}

func TestTransfer(t *testing.T) {
	out := os.Getenv("WARREN_BENCH_OBJSTORE")
	if out == "" {
		t.Skip("a benchmark: set WARREN_BENCH_OBJSTORE to a directory for its results")
	}
	s3 := fleettest.StartS3(t)
	ctx := context.Background()
	st, err := objstore.New(ctx, objstore.Config{Endpoint: s3.Endpoint, Bucket: "bench", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey, Region: s3.Region})
	if err != nil {
		t.Fatal(err)
	}
	mc, err := minio.New(s3.Endpoint, &minio.Options{Creds: s3Creds(s3), Region: s3.Region})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := synthmem.Image(memMiB, used, 1)
	snap := bytes.Clone(tmpl)
	r := rand.New(rand.NewPCG(7, 7))
	pages := len(snap) / synthmem.PageSize
	for range int(float64(pages)*dirty) / runPages {
		first := r.IntN(pages - runPages)
		synthmem.Fill(snap[first*synthmem.PageSize:(first+runPages)*synthmem.PageSize], r)
	}
	dir := t.TempDir()
	tl, tb := layer(t, dir, "template", tmpl)
	sl, sb := layer(t, dir, "snapshot", snap)
	var results []result
	for _, v := range versions {
		tbun, sbun := bundle(t, tb, v.cuts(tl)), bundle(t, sb, v.cuts(sl))
		res := result{Version: v.Name, TemplateFiles: files(tbun), SnapshotFiles: files(sbun)}
		var put1, put2, get, cached []time.Duration
		for i := range runs {
			tenant := fmt.Sprintf("t%d-%d", len(results), i) // a fresh tenant: nothing of it in the bucket
			start := time.Now()
			tref, err := st.PutBundle(ctx, tenant, bytes.NewReader(tbun))
			if err != nil {
				t.Fatal(err)
			}
			put1 = append(put1, time.Since(start))
			start = time.Now()
			ref, err := st.PutBundle(ctx, tenant, bytes.NewReader(sbun))
			if err != nil {
				t.Fatal(err)
			}
			put2 = append(put2, time.Since(start))
			var back bytes.Buffer
			start = time.Now()
			if err := st.GetBundle(ctx, ref, tenant, &back); err != nil {
				t.Fatal(err)
			}
			get = append(get, time.Since(start))
			// A host that fetched the template's bundle before (its
			// objects cache, as warren-hostd keeps it): v2's chunks the
			// snapshot shares with the template come from there.
			host, err := objstore.New(ctx, objstore.Config{Endpoint: s3.Endpoint, Bucket: "bench", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey,
				Region: s3.Region, CacheDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			if err := host.GetBundle(ctx, tref, tenant, io.Discard); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			if err := host.GetBundle(ctx, ref, tenant, io.Discard); err != nil {
				t.Fatal(err)
			}
			cached = append(cached, time.Since(start))
			if !bytes.Equal(back.Bytes()[:512], sbun[:512]) || back.Len() < len(sbun)-1024 {
				t.Fatalf("%s: the snapshot's bundle came back different", v.Name)
			}
			if i == 0 {
				for o := range mc.ListObjects(ctx, "bench", minio.ListObjectsOptions{Prefix: tenant + "/blobs/", Recursive: true}) {
					res.Blobs++
					res.Stored += o.Size
				}
			}
		}
		res.Template = stats.Summarise(v.Name, put1)
		res.Snapshot = stats.Summarise(v.Name, put2)
		res.Get = stats.Summarise(v.Name, get)
		res.GetCached = stats.Summarise(v.Name, cached)
		results = append(results, res)
	}
	v1, v2 := results[0], results[1]
	fmt.Printf("template %d MiB (%.0f%% of pages used), one snapshot %.1f%% rewritten in runs of %d pages; memory layers %.1f and %.1f MiB; S3 (SeaweedFS) on loopback, objstore.Parallel %d\n\n",
		memMiB, 100*used, 100*dirty, runPages, mibf(int64(len(tb))), mibf(int64(len(sb))), objstore.Parallel)
	for _, r := range results {
		fmt.Printf("%-16s template bundle %5d files, snapshot bundle %5d files; in the bucket after both: %5d blobs, %.1f MiB\n",
			r.Version, r.TemplateFiles, r.SnapshotFiles, r.Blobs, mibf(r.Stored))
	}
	fmt.Printf("  v2 stores %.2fx less than v1 (1 MiB groups: %.2fx)\n\n", float64(v1.Stored)/float64(max(v2.Stored, 1)), float64(v1.Stored)/float64(max(results[2].Stored, 1)))
	stats.Table(os.Stdout, "upload the template's bundle (nothing of the tenant in the bucket)", v2.Template, v1.Template)
	fmt.Println()
	stats.Table(os.Stdout, "upload the snapshot's bundle (the template's there)", v2.Snapshot, v1.Snapshot)
	fmt.Println()
	stats.Table(os.Stdout, "fetch the snapshot's bundle (no cache)", v2.Get, v1.Get)
	fmt.Println()
	stats.Table(os.Stdout, "fetch the snapshot's bundle on a host that fetched the template's (its cache)", v2.GetCached, v1.GetCached)
	g := results[2]
	fmt.Println()
	stats.Table(os.Stdout, "1 MiB groups against v1: upload the template's bundle", g.Template, v1.Template)
	stats.Table(os.Stdout, "1 MiB groups against v1: upload the snapshot's bundle", g.Snapshot, v1.Snapshot)
	stats.Table(os.Stdout, "1 MiB groups against v1: fetch the snapshot's bundle", g.Get, v1.Get)
	stats.Table(os.Stdout, "1 MiB groups against v1: fetch it with the template's cached", g.GetCached, v1.GetCached)
	if err := stats.WriteJSON(filepath.Join(out, "transfer.json"), map[string]any{"mem_mib": memMiB, "used": used, "dirty": dirty, "run_pages": runPages,
		"parallel": objstore.Parallel, "results": results}); err != nil {
		t.Fatal(err)
	}
	if err := writePlot(filepath.Join(out, "transfer.png"), results); err != nil {
		t.Fatal(err)
	}
}

func mibf(b int64) float64 { return float64(b) / (1 << 20) }
