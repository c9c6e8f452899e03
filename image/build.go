package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/warrenvm/warren/image/flatten"
	"github.com/warrenvm/warren/internal/atomicfile"
)

// Build returns the read-only ext4 base of img, building it unless the
// store has it already (then Cached is true). Building:
//
//  1. fetches each layer's compressed blob into a private directory under
//     Dir/tmp, reading at most the size the manifest declares (plus one
//     byte, to notice more) and checking its sha256 against the
//     manifest's digest;
//  2. reads the layers uncompressed (gzip, zstd or plain, told apart by
//     their first bytes, as docker-archives call every layer gzip), at
//     most MaxUncompressed bytes for all of them, checks each against
//     the config's diff_id, and flattens them (package flatten: pass 1,
//     headers only);
//  3. streams the flattened tree (pass 2) and Warren's /.warren/image.json
//     into tar2ext4, which writes a compact ext4 without mounting
//     anything, then makes it an ordinary writable file system of
//     DiskBytes with e2fsprogs (see ext4.go);
//  4. publishes it: fsync, rename of the complete directory into
//     Dir/bases/KEY.
//
// A build that fails or is cancelled (ctx) leaves no base; what it left
// under Dir/tmp, even when its process was killed, is removed by the next
// Build. Concurrent Builds of one key (goroutines or processes) build it
// once: the others wait for the key's lock and find the base.
func (s *Store) Build(ctx context.Context, img v1.Image, opts BuildOptions) (*Base, error) {
	start := time.Now()
	progress := opts.Progress
	if progress == nil {
		progress = func(Progress) {}
	}
	if opts.DiskBytes < 0 || opts.DiskBytes > MaxDiskBytes || (opts.DiskBytes != 0 && opts.DiskBytes < MinDiskBytes) {
		return nil, fmt.Errorf("image build: disk size %d: want %d to %d bytes (or 0 for the default)", opts.DiskBytes, MinDiskBytes, MaxDiskBytes)
	}
	if opts.MaxUncompressed < 0 || opts.MaxEntries < 0 {
		return nil, fmt.Errorf("image build: negative limits %d, %d", opts.MaxUncompressed, opts.MaxEntries)
	}
	if opts.MaxUncompressed == 0 {
		opts.MaxUncompressed = DefaultMaxUncompressed
	}
	info, _, err := readConfig(img)
	if err != nil {
		return nil, fmt.Errorf("image build: %w", err)
	}
	key := s.Key(info.digest, opts.DiskBytes)
	cached := func(b *Base) *Base {
		b.Cached = true
		progress(Progress{Step: "cached", Layers: len(info.manifest.Layers)})
		return b
	}
	if b, err := s.Lookup(key); err == nil {
		return cached(b), nil
	}
	if err := s.init(); err != nil {
		return nil, err
	}
	tools, err := s.Tools.resolve()
	if err != nil {
		return nil, err
	}
	l, err := lock(ctx, s.lockPath(key))
	if err != nil {
		return nil, fmt.Errorf("image build %s: waiting for another build of it: %w", info.digest, err)
	}
	defer l.Close()
	if b, err := s.Lookup(key); err == nil {
		return cached(b), nil
	}
	s.cleanTmp()
	bd, err := s.newBuildDir(key)
	if err != nil {
		return nil, err
	}
	defer bd.remove()
	b := &builder{ctx: ctx, img: img, info: info, key: key, opts: opts, tools: tools, dir: bd.path, progress: progress, start: start}
	out, err := b.build()
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("image build %s: %w", info.digest, err)
	}
	final := filepath.Join(s.basesDir(), key)
	if err := os.Rename(out, final); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
			// Built meanwhile by someone who did not take the lock.
			if b, err := s.Lookup(key); err == nil {
				return cached(b), nil
			}
		}
		return nil, fmt.Errorf("image build %s: publish: %w", info.digest, err)
	}
	if err := atomicfile.SyncDir(s.basesDir()); err != nil {
		return nil, fmt.Errorf("image build %s: publish: %w", info.digest, err)
	}
	base, err := s.Lookup(key)
	if err != nil {
		return nil, err
	}
	progress(Progress{Step: "done", Layers: len(info.manifest.Layers), Layer: len(info.manifest.Layers)})
	return base, nil
}

// builder is one build in progress; its methods run on Build's goroutine.
type builder struct {
	ctx      context.Context
	img      v1.Image
	info     *imageInfo
	key      string
	opts     BuildOptions
	tools    Tools
	dir      string // the private build directory
	progress func(Progress)
	start    time.Time
}

func (b *builder) blob(i int) string { return filepath.Join(b.dir, "blobs", strconv.Itoa(i)) }

// build makes the base's directory (base.ext4, base.json) in the build
// directory and returns its path.
func (b *builder) build() (string, error) {
	layers := b.info.manifest.Layers
	var declared int64
	for _, l := range layers {
		declared += l.Size
	}
	if limit := b.opts.MaxUncompressed + b.opts.MaxUncompressed/64 + 1<<20; declared > limit {
		return "", fmt.Errorf("the layers' blobs are %d bytes, more than the uncompressed limit of %d (MaxUncompressed) allows", declared, b.opts.MaxUncompressed)
	}
	if err := os.Mkdir(filepath.Join(b.dir, "blobs"), 0o700); err != nil {
		return "", err
	}
	for i, d := range layers {
		if err := b.fetch(i, d); err != nil {
			return "", fmt.Errorf("layer %d/%d (%s): %w", i+1, len(layers), d.Digest, err)
		}
	}

	// Pass 1: headers, whiteouts, hard links; each layer's diff_id.
	tree := flatten.New(flatten.Limits{MaxEntries: b.opts.MaxEntries})
	bud := &budget{max: b.opts.MaxUncompressed}
	for i := range layers {
		b.progress(Progress{Step: "reading", Layer: i + 1, Layers: len(layers), Bytes: bud.used})
		r, err := b.openLayer(i, bud, sha256.New())
		if err != nil {
			return "", fmt.Errorf("layer %d/%d: %w", i+1, len(layers), err)
		}
		r.report = func(n int64) {
			b.progress(Progress{Step: "reading", Layer: i + 1, Layers: len(layers), Bytes: n})
		}
		err = tree.AddLayer(r)
		if err == nil {
			err = r.checkDiffID(b.info.config.RootFS.DiffIDs[i])
		}
		r.Close()
		if err != nil {
			return "", fmt.Errorf("layer %d/%d: %w", i+1, len(layers), err)
		}
	}
	st := tree.Stats()

	disk := roundDisk(b.opts.DiskBytes)
	if disk == 0 {
		disk = max(DefaultDiskBytes, roundDisk(2*st.ContentBytes+1<<30))
		if disk > MaxDiskBytes {
			return "", fmt.Errorf("an image of %d bytes of content: too large for the largest disk (%d bytes)", st.ContentBytes, int64(MaxDiskBytes))
		}
	}
	if need := estimateDisk(st); disk < need {
		return "", fmt.Errorf("a disk of %d bytes is too small for this image: its %d bytes of content in %d files need about %d; ask for at least %d MiB",
			disk, st.ContentBytes, st.Inodes(), need, (need+1<<20-1)>>20)
	}
	gc, err := guestConfig(b.info.config, b.opts.Ref, b.info.digest)
	if err != nil {
		return "", err
	}
	cfgJSON, err := gc.Marshal()
	if err != nil {
		return "", err
	}

	// Pass 2 into tar2ext4, then e2fsprogs.
	out := filepath.Join(b.dir, "base")
	if err := os.Mkdir(out, 0o700); err != nil {
		return "", err
	}
	img := filepath.Join(out, "base.ext4")
	pad := padInodes(st)
	cur, budget2 := 0, &budget{max: b.opts.MaxUncompressed}
	open := func(i int) (io.ReadCloser, error) {
		cur = i + 1
		return b.openLayer(i, budget2, nil)
	}
	report := func(n int64) {
		b.progress(Progress{Step: "unpacking", Layer: cur, Layers: len(layers), Bytes: n, Total: st.ContentBytes})
	}
	report(0)
	if err := writeCompact(tree, open, func(tw *tar.Writer) error { return warrenEntries(tw, cfgJSON, pad) }, img, disk, report); err != nil {
		return "", err
	}
	b.progress(Progress{Step: "formatting", Layer: len(layers), Layers: len(layers)})
	fsst, err := b.tools.finish(b.ctx, img, disk, uuidFor(b.key), pad)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(img, 0o444); err != nil {
		return "", err
	}
	rec := Base{
		Key: b.key, Digest: b.info.digest, Config: gc, DiskBytes: disk, ContentBytes: st.ContentBytes,
		Layers: len(layers), Files: st.Inodes() + st.HardLinks, Inodes: fsst.inodes, FreeInodes: fsst.freeInodes,
		Format: FormatVersion, Created: time.Now().UTC(), BuildTime: time.Since(b.start),
	}
	j, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return "", err
	}
	if err := writeSynced(filepath.Join(out, "base.json"), append(j, '\n'), 0o444); err != nil {
		return "", err
	}
	if err := atomicfile.SyncDir(out); err != nil {
		return "", err
	}
	return out, nil
}

// fetch copies layer i's compressed blob into the build directory,
// checking its size and digest as it streams.
func (b *builder) fetch(i int, d v1.Descriptor) (err error) {
	n := len(b.info.manifest.Layers)
	b.progress(Progress{Step: "fetching", Layer: i + 1, Layers: n, Total: d.Size})
	l, err := b.img.LayerByDigest(d.Digest)
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.OpenFile(b.blob(i), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	h := sha256.New()
	pw := &progressWriter{report: func(done int64) {
		b.progress(Progress{Step: "fetching", Layer: i + 1, Layers: n, Bytes: done, Total: d.Size})
	}}
	got, err := io.Copy(io.MultiWriter(f, h, pw), io.LimitReader(ctxReader{b.ctx, rc}, d.Size+1))
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	switch {
	case got > d.Size:
		return fmt.Errorf("the blob is longer than the %d bytes the manifest declares", d.Size)
	case got < d.Size:
		return fmt.Errorf("the blob is %d bytes, the manifest declares %d", got, d.Size)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != d.Digest.Hex {
		return fmt.Errorf("digest mismatch: the blob's sha256 is %s, the manifest says %s", sum, d.Digest)
	}
	return nil
}

// budget bounds the uncompressed bytes of all layers of one pass.
type budget struct{ used, max int64 }

// layerReader is a fetched layer, uncompressed, hashed (when h is set),
// counted against a budget and stopped by the build's context.
type layerReader struct {
	f      *os.File
	dec    io.Reader
	close  func()
	h      hash.Hash
	b      *budget
	report func(int64)
	last   int64
}

func (b *builder) openLayer(i int, bud *budget, h hash.Hash) (*layerReader, error) {
	f, err := os.Open(b.blob(i))
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(ctxReader{b.ctx, f}, 1<<16)
	lr := &layerReader{f: f, h: h, b: bud, close: func() {}}
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		z, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("gzip: %w", err)
		}
		lr.dec, lr.close = z, func() { z.Close() }
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		z, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(128<<20))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("zstd: %w", err)
		}
		lr.dec, lr.close = z, z.Close
	default:
		lr.dec = br
	}
	return lr, nil
}

func (r *layerReader) Read(p []byte) (int, error) {
	n, err := r.dec.Read(p)
	if n > 0 {
		r.b.used += int64(n)
		if r.b.used > r.b.max {
			return 0, fmt.Errorf("the layers uncompress to more than %d bytes (the MaxUncompressed limit)", r.b.max)
		}
		if r.h != nil {
			r.h.Write(p[:n])
		}
		if r.report != nil && r.b.used-r.last >= 8<<20 {
			r.last = r.b.used
			r.report(r.b.used)
		}
	}
	return n, err
}

func (r *layerReader) Close() error {
	r.close()
	return r.f.Close()
}

// checkDiffID compares what was read (all of it) with the config's diff_id.
func (r *layerReader) checkDiffID(want v1.Hash) error {
	if got := hex.EncodeToString(r.h.Sum(nil)); got != want.Hex {
		return fmt.Errorf("diff_id mismatch: the uncompressed layer's sha256 is %s, the config says %s", got, want)
	}
	return nil
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// progressWriter reports the bytes written through it, every 8 MiB.
type progressWriter struct {
	n, last int64
	report  func(int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	if p.n-p.last >= 8<<20 {
		p.last = p.n
		p.report(p.n)
	}
	return len(b), nil
}
