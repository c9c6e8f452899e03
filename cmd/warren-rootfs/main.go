// Command warren-rootfs packs a root file system (a directory or a tar)
// into an OCI image layout with an image config, for `make rootfs`
// (rootfs/debian.sh); with --base it also builds the image's ext4 base in
// a store directory, to measure it. The work is package image's
// (FromRootfs, Pack, Store.Build); this only parses flags.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/warrenvm/warren/image"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var env list
	root := flag.String("root", "", "the root file system: a directory or a tar file")
	ref := flag.String("image", "", "instead of --root: an image reference (oci-layout:DIR:TAG, docker-archive:FILE, a registry), as is")
	out := flag.String("layout", "", "the OCI layout directory to write (made if absent)")
	tag := flag.String("tag", "latest", "the image's tag in the layout")
	flag.Var(&env, "env", "KEY=VALUE of the image config's Env (repeatable)")
	workdir := flag.String("workdir", "", "the image config's WorkingDir")
	user := flag.String("user", "", "the image config's User")
	cmdJSON := flag.String("cmd", "", `the image config's Cmd, a JSON array (e.g. '["/bin/bash"]')`)
	epJSON := flag.String("entrypoint", "", "the image config's Entrypoint, a JSON array")
	base := flag.String("base", "", "also build the image's ext4 base in this store directory and report it")
	disk := flag.Int64("disk-mib", 0, "with --base: the disk size in MiB (0: the default)")
	flag.Parse()
	if (*root == "") == (*ref == "") || (*out == "" && *base == "") || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: warren-rootfs --root DIR|TAR --layout DIR [--tag T] [--env K=V]... [--workdir D] [--user U] [--cmd JSON] [--entrypoint JSON] [--base STORE [--disk-mib N]]\n       warren-rootfs --image REF --base STORE [--disk-mib N]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *ref != "" {
		err = measure(ctx, *ref, *base, *disk<<20)
	} else {
		err = run(ctx, *root, *out, *tag, env, *workdir, *user, *cmdJSON, *epJSON, *base, *disk<<20)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "warren-rootfs:", err)
		os.Exit(1)
	}
}

// report is what warren-rootfs prints (JSON) for the recipe's records.
type report struct {
	Digest            string      `json:"digest"`
	LayerDigest       string      `json:"layer_digest"`
	LayerCompressed   int64       `json:"layer_compressed_bytes"`
	LayerUncompressed int64       `json:"layer_uncompressed_bytes"`
	PackSeconds       float64     `json:"pack_s,omitempty"`
	Base              *baseReport `json:"base,omitempty"`
}

// baseReport describes the built base.
type baseReport struct {
	Key          string  `json:"key"`
	Path         string  `json:"path"`
	DiskBytes    int64   `json:"disk_bytes"`
	ContentBytes int64   `json:"content_bytes"`
	AllocBytes   int64   `json:"allocated_bytes"`
	Files        int     `json:"files"`
	Inodes       int64   `json:"inodes"`
	FreeInodes   int64   `json:"free_inodes"`
	Seconds      float64 `json:"build_s"`
	Cached       bool    `json:"cached"`
}

func run(ctx context.Context, root, out, tag string, env []string, workdir, user, cmdJSON, epJSON, store string, disk int64) error {
	img, err := image.FromRootfs(root)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg := cf.Config
	cfg.Env, cfg.WorkingDir, cfg.User = env, workdir, user
	for _, a := range []struct {
		s   string
		dst *[]string
	}{{cmdJSON, &cfg.Cmd}, {epJSON, &cfg.Entrypoint}} {
		if a.s != "" {
			if err := json.Unmarshal([]byte(a.s), a.dst); err != nil {
				return fmt.Errorf("--cmd/--entrypoint %q: %w", a.s, err)
			}
		}
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		return err
	}
	rep := &report{}
	if out != "" {
		t := time.Now()
		if err := image.Pack(img, out, tag); err != nil {
			return err
		}
		rep.PackSeconds = time.Since(t).Seconds()
		// Measure what was written, from the layout.
		if img, err = image.Open(ctx, image.LayoutPrefix+out+":"+tag, image.OpenOptions{}); err != nil {
			return err
		}
	}
	return finish(ctx, img, rep, store, disk, "warren-rootfs:"+tag)
}

// measure describes an existing image and builds its base.
func measure(ctx context.Context, ref, store string, disk int64) error {
	img, err := image.Open(ctx, ref, image.OpenOptions{})
	if err != nil {
		return err
	}
	return finish(ctx, img, &report{}, store, disk, ref)
}

// finish describes img, builds its base in store (if given) and prints
// the report.
func finish(ctx context.Context, img v1.Image, rep *report, store string, disk int64, ref string) error {
	if err := describe(img, rep); err != nil {
		return err
	}
	if store != "" {
		s := &image.Store{Dir: store}
		b, err := s.Build(ctx, img, image.BuildOptions{DiskBytes: disk, Ref: ref, Progress: func(p image.Progress) {
			fmt.Fprintf(os.Stderr, "base: %s %d/%d %d/%d\n", p.Step, p.Layer, p.Layers, p.Bytes, p.Total)
		}})
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		syscall.Stat(b.Path, &st)
		rep.Base = &baseReport{b.Key, b.Path, b.DiskBytes, b.ContentBytes, st.Blocks * 512, b.Files, b.Inodes, b.FreeInodes, b.BuildTime.Seconds(), b.Cached}
	}
	j, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(j))
	return nil
}

// describe fills in the image's digests and its layer's sizes.
func describe(img v1.Image, rep *report) error {
	d, err := img.ConfigName()
	if err != nil {
		return err
	}
	rep.Digest = d.String()
	ls, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range ls {
		ld, err := l.Digest()
		if err != nil {
			return err
		}
		sz, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
		rep.LayerDigest, rep.LayerCompressed, rep.LayerUncompressed = ld.String(), rep.LayerCompressed+sz, rep.LayerUncompressed+n
	}
	return nil
}
