package daemon

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// Sandbox bundles: one snapshot of a sandbox, self-contained, to move it
// to another daemon (GET /v1/sandboxes/{id}/bundle, POST
// /v1/sandboxes/import; the fleet keeps them in its object store,
// fleet/objstore).
//
// A suspended sandbox is its record, its snapshot (a state file and a
// memsnap chain of memory layers) and its disks: each writable disk a
// cow/disk chain from the snapshot's frozen layer down to its template's
// base (and, for an image template, the image's shared base), each
// read-only disk a file of its template. The restore needs no kernel
// (the memory holds it) and nothing else of the template. A bundle
// carries all of it, flattened, so the importing daemon needs nothing but
// the bundle:
//
//   - "state": a new full snapshot's state file, written at export with
//     vmsnap.Write from the snapshot loaded and verified (vmsnap.Load):
//     its run options name no host path ("/bundle/disk<I>", the devices
//     keep their saved names), nor does its "disks" section;
//   - "memory": that snapshot's memory, one base layer holding the whole
//     chain's effective memory (memsnap's Chain reads), whatever the
//     exporting host's layers were stored as;
//   - "disk<I>": disk I's effective contents, every image of its chain
//     read through (cow/disk), as a raw image.
//
// Exporting one snapshot twice gives the same bundle but for the memory
// layer's file name (vmsnap makes it unique) and what names it: the state
// file, bundle.json and "end"; its chunks are equal, and the object store
// keeps them once.
//
// The stream is a tar of regular files: "bundle.json" (bundleHeader)
// first, then each part as pieces named PART/<offset, 16 hex digits>, in
// increasing offsets, then "end" (bundleEnd: every file before it and its
// SHA-256, in order). The state and the disks are cut every bundleChunk
// bytes (all-zero pieces left out: the parts are sparse). The memory
// layer is cut where its memsnap chunks are (memoryCuts): its header,
// then one piece per chunk, then its index and footer. Memsnap writes a
// chunk for each aligned block of guest memory with non-zero pages, and
// writes it deterministically, so a block that did not change between two
// snapshots, or since the template, is the same piece, byte for byte,
// whose SHA-256 is the one the layer's index records: the chunk the host's
// page store (hostd/pagestore) keeps under that digest. The fleet's object
// store (fleet/objstore), which keeps every file of a bundle as a blob
// named by its contents, per tenant and key, thus holds the page store's
// chunks, each once per tenant and key, whichever sandboxes, snapshots
// and templates share it (version 1 bundles cut the memory every
// bundleChunk bytes too, so one changed block changed every piece after
// it). A guest too large for one piece per chunk within memoryPiecesMax
// has its memory cut at aligned groups of blocks instead (memoryCuts).
//
// Import trusts nothing of it: the header's fields are bounded, the part
// names are a fixed set and become fixed file names in the new sandbox's
// directory (no name or path of the bundle is ever opened), every chunk
// must fall inside its part, in order, the files' digests must match
// "end", the snapshot is loaded and verified (checksums, memory hashes,
// the machine state) from the import's own directory, its run options
// must fit the header, and raw disks may not start with an overlay's
// magic. Only then is the snapshot rewritten with this host's paths and
// the sandbox recorded, suspended: POST .../resume restores it like any
// suspended sandbox. Any failure removes everything the import made.
//
// Not carried: network sandboxes (their egress state names host files),
// and the record's history (other snapshots, rolling settings, forks).

const (
	// bundleVersion is the version exports write: 2 cuts the memory at
	// its chunks. Imports read 1 and 2.
	bundleVersion = 2
	// bundleChunk is the size of the state's and disks' pieces and the
	// most bytes any piece holds.
	bundleChunk = 4 << 20
	// memoryPiecesMax is how many pieces memoryCuts aims to cut a guest's
	// memory into at most: one per memsnap chunk for guests up to 4 GiB
	// (at its default 256 KiB chunks), aligned groups of chunks beyond.
	memoryPiecesMax = 16384
	// memoryGroupMin is the least memory, in bytes, one piece of the
	// memory part covers: memsnap's default chunk.
	memoryGroupMin = memsnap.DefaultChunkPages * memsnap.DefaultPageSize
	// bundleHeaderMax and bundleEndMax bound the two records.
	bundleHeaderMax = 1 << 20
	bundleEndMax    = 32 << 20
	// bundleStateMax bounds the state file; bundleDiskMax a disk.
	bundleStateMax = 64 << 20
	bundleDiskMax  = 1 << 40
	bundleMaxDisks = 16
	// bundleMaxMemMiB bounds a bundle's guest memory.
	bundleMaxMemMiB = 1 << 20
)

// bundleHeader is a bundle's "bundle.json".
type bundleHeader struct {
	Version int `json:"version"`
	// Kind is what the bundle holds: "" a sandbox's snapshot, "template"
	// a template's (templatebundle.go); each import takes its own kind
	// only.
	Kind string `json:"kind,omitempty"`
	// Snapshot is the snapshot's name (the imported one keeps it).
	Snapshot string `json:"snapshot"`
	// Template is the id of the sandbox's template where it was made
	// (for people: the importing daemon does not need it).
	Template string `json:"template,omitempty"`
	MemMiB   int    `json:"mem_mib"`
	CPUs     int    `json:"cpus"`
	// Env is the sandbox's environment for exec.
	Env              []string `json:"env,omitempty"`
	BalloonTargetMiB *uint64  `json:"balloon_target_mib,omitempty"`
	// StateBytes and MemoryBytes are the sizes of "state" and "memory";
	// MemoryLayer the memory layer's file name the state file names.
	StateBytes  int64  `json:"state_bytes"`
	MemoryBytes int64  `json:"memory_bytes"`
	MemoryLayer string `json:"memory_layer"`
	// Disks are the VM's disks, by index in its run options.
	Disks []bundleDisk `json:"disks,omitempty"`
	// TemplateRecord is a template bundle's template (kind "template"
	// only).
	TemplateRecord *bundleTemplate `json:"template_record,omitempty"`
}

// bundleKindTemplate is a template bundle's bundleHeader.Kind.
const bundleKindTemplate = "template"

// bundleDisk is one disk of a bundle.
type bundleDisk struct {
	Bytes    int64 `json:"bytes"`
	ReadOnly bool  `json:"ro,omitempty"`
}

// bundleEnd is a bundle's "end": every file before it, in order.
type bundleEnd struct {
	Files [][2]string `json:"files"` // name, SHA-256 hex
}

// bundleRunOptions are the fields of a snapshot's run options
// (vmmproc's runOptions) that name host files; the others pass through
// untouched.
type bundleDiskOption struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"ro,omitempty"`
	Name     string `json:"name,omitempty"`
}

var memLayerRE = regexp.MustCompile(`^bundle\.[0-9a-f]{1,32}-[0-9a-f]{1,32}\.wsnap$`)

// bundlePlaceholder is the path a bundle's run options give disk i.
func bundlePlaceholder(i int) string { return "/bundle/disk" + strconv.Itoa(i) }

// rewriteOptions returns raw with its disks' paths replaced by path(i)
// (keeping each device's name: its saved state knows it by it) and its
// vsock path by vsock; it also returns the disks as they were.
func rewriteOptions(raw json.RawMessage, path func(i int) string, vsock string) (json.RawMessage, []bundleDiskOption, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, nil, fmt.Errorf("run options: %w", err)
	}
	var disks []bundleDiskOption
	if b, ok := m["disks"]; ok {
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		if err := d.Decode(&disks); err != nil {
			return nil, nil, fmt.Errorf("run options: disks: %w", err)
		}
	}
	if len(disks) > bundleMaxDisks {
		return nil, nil, fmt.Errorf("run options: %d disks, at most %d", len(disks), bundleMaxDisks)
	}
	orig := append([]bundleDiskOption(nil), disks...)
	for i := range disks {
		if disks[i].Name == "" {
			disks[i].Name = disks[i].Path
		}
		if len(disks[i].Name) > 4096 || strings.ContainsRune(disks[i].Name, 0) {
			return nil, nil, fmt.Errorf("run options: disk %d: bad name", i)
		}
		disks[i].Path = path(i)
	}
	if disks != nil {
		b, err := json.Marshal(disks)
		if err != nil {
			return nil, nil, err
		}
		m["disks"] = b
	}
	if _, ok := m["vsock"]; ok {
		b, _ := json.Marshal(vsock)
		m["vsock"] = b
	}
	out, err := json.Marshal(m)
	return out, orig, err
}

// exportBundle writes s's snapshot name (its latest when "") to w as a
// bundle (caller holds s.mu). Everything is prepared before the first
// byte is written: an error returned with started false is the
// request's; one with started true cut the stream short.
func (d *Daemon) exportBundle(s *sbState, name string, w io.Writer) (started bool, err error) {
	sb := s.rec
	if sb.Network {
		return false, errf(409, "sandbox %s has a network: bundles do not carry network sandboxes yet", sb.ID)
	}
	var snap *store.Snapshot
	if name == "" {
		snap = sb.Latest()
	} else {
		for i := range sb.Snapshots {
			if sb.Snapshots[i].Name == name {
				snap = &sb.Snapshots[i]
			}
		}
	}
	if snap == nil {
		return false, errf(404, "sandbox %s has no snapshot %q", sb.ID, name)
	}
	if err := d.keyUsable(sb.Tenant); err != nil {
		return false, err
	}
	release, err := d.acquireDisks(*sb)
	if err != nil {
		return false, cryptStatus(fmt.Errorf("disks: %w", err))
	}
	defer release()
	ls, closeLS, err := d.loadForExport(sb.Tenant, snap.Path)
	if err != nil {
		return false, fmt.Errorf("snapshot %s: %w", snap.Name, err)
	}
	defer closeLS()
	hdr := bundleHeader{Version: bundleVersion, Snapshot: snap.Name, Template: sb.Template, MemMiB: sb.MemMiB, CPUs: sb.CPUs,
		Env: sb.Env, BalloonTargetMiB: sb.BalloonTargetMiB}
	// The snapshot, rewritten self-contained, goes to a scratch directory
	// (the decryption directory for a tenant with a key: plaintext).
	scratchRoot := d.store.SandboxDir(sb.Tenant, sb.ID)
	if d.encrypts(sb.Tenant) && d.cfg.DecryptDir != "" {
		scratchRoot = d.cfg.DecryptDir
		os.MkdirAll(scratchRoot, 0o700)
	}
	return d.streamBundle(w, sb.Tenant, snap.Name, ls, hdr, scratchRoot)
}

// streamBundle writes the bundle of the loaded snapshot ls (named name,
// of tenant) to w: hdr's fields with the parts' sizes and names added,
// the state rewritten into a scratch directory under scratchRoot, the
// memory and each disk read through its chain. Everything is prepared
// before the first byte is written: an error returned with started
// false is the request's; one with started true cut the stream short.
func (d *Daemon) streamBundle(w io.Writer, tenant, name string, ls *vmsnap.Snapshot, hdr bundleHeader, scratchRoot string) (started bool, err error) {
	if ls.Disks == nil {
		return false, errf(409, "snapshot %s holds no disk state (taken by an older warren): take a new one", name)
	}
	opts, disks, err := rewriteOptions(ls.Meta.Options, bundlePlaceholder, "/bundle/vsock")
	if err != nil {
		return false, fmt.Errorf("snapshot %s: %w", name, err)
	}
	// The disks, each read through its chain.
	layers := map[int]string{}
	for _, dl := range ls.Disks {
		layers[dl.Index] = dl.Layer
	}
	var backs []disk.Backing
	var placeholders []vmsnap.DiskLayer
	defer func() {
		for _, b := range backs {
			if c, ok := b.(io.Closer); ok {
				c.Close()
			}
		}
	}()
	for i, do := range disks {
		src := do.Path
		if !do.ReadOnly {
			l, ok := layers[i]
			if !ok {
				return false, fmt.Errorf("snapshot %s holds no layer for its writable disk %d", name, i)
			}
			src = l
			placeholders = append(placeholders, vmsnap.DiskLayer{Index: i, Layer: bundlePlaceholder(i), Chain: []string{bundlePlaceholder(i)}})
		}
		// The VMM wrote the snapshot's paths (run options, layers) and
		// the overlays' base paths: an export opens only the tenant's
		// files, checked before and after the chain is opened.
		if err := d.tenantPaths(tenant, src); err != nil {
			return false, fmt.Errorf("disk %d: %w", i, err)
		}
		b, closeB, err := openBase(src)
		if err != nil {
			return false, fmt.Errorf("disk %d: %w", i, err)
		}
		backs = append(backs, closer{b, closeB})
		chain, ok := chainPaths(b)
		if !ok {
			return false, fmt.Errorf("disk %d: an image of unknown kind in its chain", i)
		}
		if err := d.tenantPaths(tenant, chain...); err != nil {
			return false, fmt.Errorf("disk %d: %w", i, err)
		}
		hdr.Disks = append(hdr.Disks, bundleDisk{Bytes: b.Size(), ReadOnly: do.ReadOnly})
	}
	// The snapshot, rewritten self-contained, in a scratch directory.
	scratch, err := os.MkdirTemp(scratchRoot, ".bundle-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(scratch)
	if placeholders == nil {
		placeholders = []vmsnap.DiskLayer{}
	}
	res, err := vmsnap.Write(filepath.Join(scratch, "bundle"), &vmsnap.Capture{Kind: vmsnap.Full, State: ls.State, Devices: ls.Devices,
		Options: opts, Fingerprint: ls.Fingerprint, Memory: ls.Chain.Reader(), Disks: placeholders, Created: ls.Meta.Created})
	if err != nil {
		return false, fmt.Errorf("snapshot %s: %w", name, err)
	}
	stateF, err := os.Open(res.StatePath)
	if err != nil {
		return false, err
	}
	defer stateF.Close()
	memF, err := os.Open(res.LayerPath)
	if err != nil {
		return false, err
	}
	defer memF.Close()
	for _, f := range []*os.File{stateF, memF} {
		fi, err := f.Stat()
		if err != nil {
			return false, err
		}
		if f == stateF {
			hdr.StateBytes = fi.Size()
		} else {
			hdr.MemoryBytes = fi.Size()
		}
	}
	hdr.MemoryLayer = filepath.Base(res.LayerPath)
	if !memLayerRE.MatchString(hdr.MemoryLayer) {
		return false, fmt.Errorf("memory layer %q: unexpected name", hdr.MemoryLayer)
	}
	memCuts, err := memoryCuts(memF, hdr.MemoryBytes)
	if err != nil {
		return false, fmt.Errorf("snapshot %s: %w", name, err)
	}
	// The stream.
	bw := &bundleWriter{tw: tar.NewWriter(w)}
	hb, _ := json.Marshal(hdr)
	started = true
	if err := bw.file("bundle.json", hb); err != nil {
		return true, err
	}
	if err := bw.part("state", stateF, hdr.StateBytes); err != nil {
		return true, err
	}
	if err := bw.pieces("memory", memF, memCuts); err != nil {
		return true, err
	}
	for i, b := range backs {
		if err := bw.part("disk"+strconv.Itoa(i), b, b.Size()); err != nil {
			return true, fmt.Errorf("disk %d: %w", i, err)
		}
	}
	eb, _ := json.Marshal(bundleEnd{Files: bw.files})
	if err := bw.file("end", eb); err != nil {
		return true, err
	}
	return true, bw.tw.Close()
}

// noNetwork refuses run options with a network device or egress
// services: they name host files and settings no bundle carries.
func noNetwork(raw json.RawMessage) error {
	var o struct {
		Tap        string          `json:"tap"`
		PrivateNet bool            `json:"private_net"`
		Egress     json.RawMessage `json:"egress"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return fmt.Errorf("run options: %w", err)
	}
	if o.Tap != "" || o.PrivateNet || (len(o.Egress) > 0 && string(o.Egress) != "null") {
		return errors.New("run options: a network: bundles do not carry network VMs")
	}
	return nil
}

// chainPaths lists the files of an opened image chain, top first; false
// when an image of it is of a kind it does not know.
func chainPaths(b disk.Backing) ([]string, bool) {
	var out []string
	for b != nil && len(out) <= 256 {
		switch v := b.(type) {
		case *disk.Overlay:
			out = append(out, v.Path())
			b = v.Base()
		case *disk.Raw:
			return append(out, v.Path()), true
		default:
			return nil, false
		}
	}
	return nil, false
}

// tenantPaths checks that each path, symbolic links resolved, is a
// regular file in tenant's directory of the state.
func (d *Daemon) tenantPaths(tenant string, paths ...string) error {
	root, err := filepath.EvalSymlinks(filepath.Join(d.store.Root, "tenants", tenant))
	if err != nil {
		return err
	}
	for _, p := range paths {
		r, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		fi, err := os.Stat(r)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(r, root+string(filepath.Separator)) || !fi.Mode().IsRegular() {
			return errf(409, "an image of the snapshot is not a file of the tenant's")
		}
	}
	return nil
}

// closer is a Backing with its close.
type closer struct {
	disk.Backing
	close func() error
}

func (c closer) Close() error { return c.close() }

// bundleWriter writes a bundle's files, noting their digests.
type bundleWriter struct {
	tw    *tar.Writer
	files [][2]string
}

func (b *bundleWriter) file(name string, data []byte) error {
	if err := b.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: 0o600, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := b.tw.Write(data); err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	b.files = append(b.files, [2]string{name, hex.EncodeToString(sum[:])})
	return nil
}

// part writes r's size bytes as pieces of bundleChunk bytes, leaving out
// all-zero ones.
func (b *bundleWriter) part(name string, r io.ReaderAt, size int64) error {
	return b.pieces(name, r, []int64{0, size})
}

// pieces writes the bytes of r between each two consecutive offsets of
// cuts (increasing, from 0 to the part's size) as pieces, one between
// each two cuts, cut again every bundleChunk bytes, leaving out all-zero
// ones.
func (b *bundleWriter) pieces(name string, r io.ReaderAt, cuts []int64) error {
	buf := make([]byte, bundleChunk)
	for i := 0; i+1 < len(cuts); i++ {
		for off := cuts[i]; off < cuts[i+1]; off += bundleChunk {
			n := int(min(bundleChunk, cuts[i+1]-off))
			if _, err := r.ReadAt(buf[:n], off); err != nil && !(errors.Is(err, io.EOF)) {
				return fmt.Errorf("%s at %d: %w", name, off, err)
			}
			if allZero(buf[:n]) {
				continue
			}
			if err := b.file(fmt.Sprintf("%s/%016x", name, off), buf[:n]); err != nil {
				return err
			}
		}
	}
	return nil
}

// memoryCuts returns where a bundle cuts the memsnap layer f (size bytes,
// written by this export and opened again to be checked): at its chunks
// (memsnap's ChunkCuts) grouped by aligned spans of memoryGroupMin bytes
// of guest memory, doubled until the guest's memory has at most
// memoryPiecesMax spans or a span reaches bundleChunk. For memsnap's
// default chunks each chunk is a piece of its own up to 4 GiB of guest
// memory. The cuts depend only on the layer's chunks and the guest's
// memory size, so equal chunks are equal pieces in any two bundles of
// guests of one size.
func memoryCuts(f io.ReaderAt, size int64) ([]int64, error) {
	l, err := memsnap.OpenReaderAt("memory", f, size)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	group := uint64(memoryGroupMin)
	for l.Header().MemSize/group > memoryPiecesMax && group < bundleChunk {
		group *= 2
	}
	return l.ChunkCuts(group), nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// checkHeader validates a bundle's header.
func (h *bundleHeader) check() error {
	switch {
	case h.Version < 1 || h.Version > bundleVersion:
		return fmt.Errorf("version %d, this daemon reads 1 to %d", h.Version, bundleVersion)
	case !snapNameRE.MatchString(h.Snapshot) || strings.HasSuffix(h.Snapshot, ".wstate"):
		return fmt.Errorf("bad snapshot name %q", h.Snapshot)
	case h.Template != "" && !store.ValidID(h.Template):
		return fmt.Errorf("bad template id %q", h.Template)
	case h.MemMiB < 1 || h.MemMiB > bundleMaxMemMiB:
		return fmt.Errorf("mem_mib %d out of range", h.MemMiB)
	case h.CPUs < 1 || h.CPUs > 64:
		return fmt.Errorf("cpus %d out of range", h.CPUs)
	case len(h.Env) > 1024:
		return fmt.Errorf("%d env entries", len(h.Env))
	case h.StateBytes < 1 || h.StateBytes > bundleStateMax:
		return fmt.Errorf("state of %d bytes", h.StateBytes)
	case h.MemoryBytes < 1 || h.MemoryBytes > int64(h.MemMiB)<<20+int64(h.MemMiB)<<16+64<<20:
		return fmt.Errorf("memory layer of %d bytes for %d MiB", h.MemoryBytes, h.MemMiB)
	case !memLayerRE.MatchString(h.MemoryLayer):
		return fmt.Errorf("bad memory layer name %q", h.MemoryLayer)
	case len(h.Disks) > bundleMaxDisks:
		return fmt.Errorf("%d disks, at most %d", len(h.Disks), bundleMaxDisks)
	}
	switch {
	case h.Kind != "" && h.Kind != bundleKindTemplate:
		return fmt.Errorf("unknown kind %.40q", h.Kind)
	case (h.Kind == bundleKindTemplate) != (h.TemplateRecord != nil):
		return fmt.Errorf("a template record goes with kind %q, and only with it", bundleKindTemplate)
	case h.TemplateRecord != nil:
		if len(h.Env) > 0 || h.BalloonTargetMiB != nil {
			return fmt.Errorf("a template bundle has no env or balloon target")
		}
		if err := h.TemplateRecord.check(len(h.Disks)); err != nil {
			return fmt.Errorf("template_record: %w", err)
		}
	}
	for _, e := range h.Env {
		if len(e) > 64<<10 || !strings.Contains(e, "=") {
			return fmt.Errorf("bad env entry")
		}
	}
	for i, dk := range h.Disks {
		if dk.Bytes < 1 || dk.Bytes > bundleDiskMax {
			return fmt.Errorf("disk %d of %d bytes", i, dk.Bytes)
		}
	}
	return nil
}

// importPart is where one part of a bundle goes.
type importPart struct {
	f    *os.File
	size int64
	next int64 // the least offset the next chunk may have
}

// received is a bundle read, checked and loaded by receiveBundle.
type received struct {
	hdr bundleHeader
	// ls is the snapshot loaded and verified from the staging directory
	// (the caller closes it); opts its run options rewritten with this
	// host's disk paths and vsock.
	ls   *vmsnap.Snapshot
	opts json.RawMessage
	// layers are its writable disks' layers (each a raw image in dir,
	// its own chain), as the record and as vmsnap keep them.
	layers  []store.DiskLayer
	vlayers []vmsnap.DiskLayer
}

// receiveBundle reads a bundle of kind ("" a sandbox's, or
// bundleKindTemplate) from r into dir: the state and memory into
// staging (dir's subdirectory, which the caller removes), each disk I as
// dir's disk<I>.base (writable) or disk<I>.ro (read-only), made
// read-only on disk. It checks everything (see the top of this file)
// and loads the snapshot from staging; vsock is the run options' new
// vsock path. On an error the caller removes dir.
func receiveBundle(r io.Reader, dir, staging, kind, vsock string) (rb *received, err error) {
	bad := func(format string, a ...any) error {
		return errf(400, "bundle: "+format, a...)
	}
	tr := tar.NewReader(r)
	next := func(want string, max int64) (*tar.Header, error) {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, bad("ends before %s", want)
		}
		if err != nil {
			return nil, bad("%v", err)
		}
		if h.Typeflag != tar.TypeReg || h.Size < 0 || h.Size > max {
			return nil, bad("%.80q: want a regular file of at most %d bytes", h.Name, max)
		}
		return h, nil
	}
	var files [][2]string
	readFile := func(h *tar.Header) ([]byte, error) {
		b := make([]byte, h.Size)
		if _, err := io.ReadFull(tr, b); err != nil {
			return nil, bad("%s: %v", h.Name, err)
		}
		return b, nil
	}
	h, err := next("bundle.json", bundleHeaderMax)
	if err != nil {
		return nil, err
	}
	if h.Name != "bundle.json" {
		return nil, bad("starts with %.80q, not bundle.json", h.Name)
	}
	hb, err := readFile(h)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(hb)
	files = append(files, [2]string{h.Name, hex.EncodeToString(sum[:])})
	rb = &received{}
	hdr := &rb.hdr
	if err := strictjson.Unmarshal(hb, hdr); err != nil {
		return nil, bad("bundle.json: %v", err)
	}
	if err := hdr.check(); err != nil {
		return nil, bad("bundle.json: %v", err)
	}
	if hdr.Kind != kind {
		return nil, bad("a %s bundle, not a %s one", bundleKindName(hdr.Kind), bundleKindName(kind))
	}
	// The parts' files: fixed names in the new directory.
	parts := map[string]*importPart{}
	create := func(name, path string, size int64) error {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if err := f.Truncate(size); err != nil {
			f.Close()
			return err
		}
		parts[name] = &importPart{f: f, size: size}
		return nil
	}
	defer func() {
		for _, p := range parts {
			p.f.Close()
		}
	}()
	statePath := filepath.Join(staging, "bundle.wstate")
	if err := create("state", statePath, hdr.StateBytes); err != nil {
		return nil, err
	}
	if err := create("memory", filepath.Join(staging, hdr.MemoryLayer), hdr.MemoryBytes); err != nil {
		return nil, err
	}
	diskPath := func(i int) string {
		if hdr.Disks[i].ReadOnly {
			return filepath.Join(dir, roName(i))
		}
		return filepath.Join(dir, baseName(i))
	}
	maxFiles := int64(3)
	for i, dk := range hdr.Disks {
		if err := create("disk"+strconv.Itoa(i), diskPath(i), dk.Bytes); err != nil {
			return nil, err
		}
		maxFiles += (dk.Bytes + bundleChunk - 1) / bundleChunk
	}
	// The memory is cut at its chunks (or groups of them: memoryCuts),
	// each piece cut again every bundleChunk bytes: at most a piece per
	// group, its header's and its index's, and one more for each
	// bundleChunk of the layer.
	memBytes := int64(hdr.MemMiB) << 20
	groups := min(memBytes/memoryGroupMin, max(memoryPiecesMax, memBytes/bundleChunk)) + 1
	maxFiles += (hdr.StateBytes+bundleChunk-1)/bundleChunk + (hdr.MemoryBytes+bundleChunk-1)/bundleChunk + groups + 2
	// The chunks, then "end".
	buf := make([]byte, bundleChunk)
	for {
		h, err := next("end", max(bundleChunk, bundleEndMax))
		if err != nil {
			return nil, err
		}
		if h.Name == "end" {
			eb, err := readFile(h)
			if err != nil {
				return nil, err
			}
			var end bundleEnd
			if err := strictjson.Unmarshal(eb, &end); err != nil {
				return nil, bad("end: %v", err)
			}
			if len(end.Files) != len(files) {
				return nil, bad("end lists %d files, the bundle has %d", len(end.Files), len(files))
			}
			for i := range files {
				if end.Files[i] != files[i] {
					return nil, bad("file %d (%.80q) does not match end's digest", i, files[i][0])
				}
			}
			break
		}
		if int64(len(files)) >= maxFiles {
			return nil, bad("more files than its parts have chunks")
		}
		pname, offs, ok := strings.Cut(h.Name, "/")
		p := parts[pname]
		off, perr := strconv.ParseUint(offs, 16, 63)
		if !ok || p == nil || perr != nil || len(offs) != 16 {
			return nil, bad("unexpected file %.80q", h.Name)
		}
		o := int64(off)
		// Pieces lie in their part, in increasing offsets, without
		// overlap; the memory's at its chunks, the others' every
		// bundleChunk bytes.
		aligned := pname == "memory" || o%bundleChunk == 0
		if !aligned || o < p.next || o >= p.size || h.Size > bundleChunk || o+h.Size > p.size || h.Size == 0 {
			return nil, bad("chunk %.80q of %d bytes out of place", h.Name, h.Size)
		}
		n, err := io.ReadFull(tr, buf[:h.Size])
		if err != nil {
			return nil, bad("%s: %v", h.Name, err)
		}
		if _, err := p.f.WriteAt(buf[:n], o); err != nil {
			return nil, err
		}
		p.next = o + h.Size
		s := sha256.Sum256(buf[:n])
		files = append(files, [2]string{h.Name, hex.EncodeToString(s[:])})
	}
	if _, err := tr.Next(); err != io.EOF {
		return nil, bad("files after end")
	}
	for _, p := range parts {
		if err := p.f.Sync(); err != nil {
			return nil, err
		}
	}
	// The snapshot, loaded and verified from the staging directory alone.
	ls, err := vmsnap.Load(statePath, nil)
	if err != nil {
		// (The tenant is told what is wrong, not this host's paths.)
		return nil, bad("snapshot: %s", strings.ReplaceAll(err.Error(), staging+"/", ""))
	}
	defer func() {
		if err != nil {
			ls.Close()
		}
	}()
	if ls.State.Machine.MemBytes > uint64(hdr.MemMiB)<<20 {
		return nil, bad("the snapshot's memory (%d bytes) exceeds mem_mib %d", ls.State.Machine.MemBytes, hdr.MemMiB)
	}
	if ls.Disks == nil {
		return nil, bad("the snapshot holds no disk state")
	}
	opts, disks, err := rewriteOptions(ls.Meta.Options, diskPath, vsock)
	if err != nil {
		return nil, bad("snapshot: %v", err)
	}
	if err := noNetwork(ls.Meta.Options); err != nil {
		return nil, bad("snapshot: %v", err)
	}
	if len(disks) != len(hdr.Disks) {
		return nil, bad("the snapshot has %d disks, bundle.json %d", len(disks), len(hdr.Disks))
	}
	writable := map[int]bool{}
	for i, do := range disks {
		if do.ReadOnly != hdr.Disks[i].ReadOnly || do.Path != bundlePlaceholder(i) {
			return nil, bad("disk %d of the snapshot does not match bundle.json", i)
		}
		writable[i] = !do.ReadOnly
		f := parts["disk"+strconv.Itoa(i)].f
		if err := checkRawImage(f, "disk"+strconv.Itoa(i)); err != nil {
			return nil, bad("%v", err)
		}
	}
	rb.vlayers = []vmsnap.DiskLayer{}
	for _, dl := range ls.Disks {
		if !writable[dl.Index] {
			return nil, bad("the snapshot has a layer for disk %d, not a writable disk of it", dl.Index)
		}
		delete(writable, dl.Index)
		p := diskPath(dl.Index)
		rb.layers = append(rb.layers, store.DiskLayer{Index: dl.Index, Layer: p, Chain: []string{p}})
		rb.vlayers = append(rb.vlayers, vmsnap.DiskLayer{Index: dl.Index, Layer: p, Chain: []string{p}})
	}
	for i, w := range writable {
		if w {
			return nil, bad("the snapshot has no layer for its writable disk %d", i)
		}
	}
	for name, p := range parts {
		if strings.HasPrefix(name, "disk") {
			if err := os.Chmod(p.f.Name(), 0o400); err != nil {
				return nil, err
			}
		}
	}
	rb.ls, rb.opts = ls, opts
	return rb, nil
}

// bundleKindName names a bundle kind for people.
func bundleKindName(kind string) string {
	if kind == "" {
		return "sandbox"
	}
	return fmt.Sprintf("%.40q", kind)
}

// loadForExport loads and verifies tenant's snapshot at path for an
// export, through the BeforeRestore hook (a decrypted working copy for a
// tenant with a key); closeLS closes it and drops the working copy.
func (d *Daemon) loadForExport(tenant, path string) (ls *vmsnap.Snapshot, closeLS func(), err error) {
	use, done := path, func() {}
	if h := d.cfg.Hooks.BeforeRestore; h != nil {
		p, dn, err := h(tenant, path)
		if err != nil {
			return nil, nil, cryptStatus(err)
		}
		use = p
		if dn != nil {
			done = dn
		}
	}
	if ls, err = vmsnap.Load(use, nil); err != nil {
		done()
		return nil, nil, err
	}
	return ls, func() { ls.Close(); done() }, nil
}

// importBundle reads a bundle from r and records it as a new suspended
// sandbox of tenant with labels.
func (d *Daemon) importBundle(tenant string, r io.Reader, labels map[string]string) (rec store.Sandbox, err error) {
	if err := d.keyUsable(tenant); err != nil {
		return rec, err
	}
	id := newID("sb")
	dir := d.store.SandboxDir(tenant, id)
	staging, cleanup, err := importDir(dir)
	if err != nil {
		return rec, err
	}
	defer cleanup(&err)
	api, vsock := d.sockets(id)
	rb, err := receiveBundle(r, dir, staging, "", vsock)
	if err != nil {
		return rec, err
	}
	defer rb.ls.Close()
	hdr, ls := rb.hdr, rb.ls
	sbs := &store.Sandbox{ID: id, Tenant: tenant, Template: hdr.Template, Status: store.Suspended, MemMiB: hdr.MemMiB, CPUs: hdr.CPUs,
		Env: hdr.Env, Labels: labels, BalloonTargetMiB: hdr.BalloonTargetMiB, API: api, Vsock: vsock,
		Console: filepath.Join(dir, "console.log"), Log: filepath.Join(dir, "vmm.log"), Created: time.Now().UTC()}
	// The tenant's templates directory, which a VMM's jail binds (the
	// tenant may have no template on this host).
	if err := os.MkdirAll(filepath.Dir(d.store.TemplateDir(tenant, "x")), 0o700); err != nil {
		return rec, err
	}
	// This host's snapshot of it.
	snaps := filepath.Join(dir, "snapshots")
	if err := os.MkdirAll(snaps, 0o700); err != nil {
		return rec, err
	}
	path := filepath.Join(snaps, hdr.Snapshot)
	res, err := vmsnap.Write(path, &vmsnap.Capture{Kind: vmsnap.Full, State: ls.State, Devices: ls.Devices, Options: rb.opts,
		Fingerprint: ls.Fingerprint, Memory: ls.Chain.Reader(), Disks: rb.vlayers, Created: ls.Meta.Created})
	if err != nil {
		return rec, err
	}
	ls.Close()
	if err := os.RemoveAll(staging); err != nil {
		return rec, err
	}
	var lb int64
	if fi, err := os.Stat(res.LayerPath); err == nil {
		lb = fi.Size()
	}
	sbs.Reason = "imported from a bundle of snapshot " + hdr.Snapshot
	sbs.Snapshots = []store.Snapshot{{Name: hdr.Snapshot, Path: path, Kind: "full", Time: time.Now().UTC(), Bytes: lb, Disks: rb.layers}}
	d.ingestSnapshots(tenant, snaps, "")
	if hook := d.cfg.Hooks.SnapshotWritten; hook != nil {
		if err := hook(tenant, path); err != nil {
			return rec, cryptStatus(fmt.Errorf("snapshot hook: %w", err))
		}
	}
	s := &sbState{rec: sbs, agent: agentclient.New(sbs.Vsock)}
	if err := d.save(s); err != nil {
		return rec, err
	}
	d.mu.Lock()
	d.sandboxes[id] = s
	d.mu.Unlock()
	d.sealIdleDisks(tenant)
	d.log.Info("sandbox imported", "tenant", tenant, "sandbox", id, "snapshot", hdr.Snapshot)
	return copyRec(sbs), nil
}

// parseLabels reads import's label=K=V query values.
func parseLabels(vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	if len(vals) > 64 {
		return nil, errf(400, "at most 64 labels")
	}
	m := map[string]string{}
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" || len(k) > 256 || len(val) > 1024 {
			return nil, errf(400, "label %.80q: want KEY=VALUE (key at most 256 bytes, value 1024)", v)
		}
		m[k] = val
	}
	return m, nil
}

// getBundle is GET /v1/sandboxes/{id}/bundle[?snapshot=NAME]: the
// sandbox's snapshot as a bundle (application/x-tar). The sandbox is held
// (its operations wait) while the bundle streams. An error after the
// stream began cuts it short: its "end" is then missing, which an import
// refuses.
func (d *Daemon) getBundle(w http.ResponseWriter, r *http.Request, s *sbState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d.serveBundle(w, "sandbox", s.rec.ID, func(bw io.Writer) (bool, error) {
		return d.exportBundle(s, r.URL.Query().Get("snapshot"), bw)
	})
}

// serveBundle streams what export writes as a bundle response (of kind
// "sandbox" or "template" id, for the log): an error before the stream
// began is the request's answer; one after it cuts the stream short,
// without its "end", which an import refuses.
func (d *Daemon) serveBundle(w http.ResponseWriter, kind, id string, export func(io.Writer) (started bool, err error)) {
	bw := bufio.NewWriterSize(&lazyHeader{w: w}, 256<<10)
	started, err := export(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		if !started {
			writeErr(w, err)
			return
		}
		d.log.Warn("bundle export failed", kind, id, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// importDir makes the directory dir of a new record (a sandbox's or a
// template's) and its staging subdirectory for an import; cleanup,
// deferred by the import with its error, removes dir when the import
// failed.
func importDir(dir string) (staging string, cleanup func(*error), err error) {
	staging = filepath.Join(dir, ".import")
	if err := os.MkdirAll(staging, 0o700); err != nil {
		return "", nil, err
	}
	return staging, func(err *error) {
		if *err != nil {
			os.RemoveAll(dir)
		}
	}, nil
}

// lazyHeader sets the bundle's content type on the first write.
type lazyHeader struct {
	w    http.ResponseWriter
	sent bool
}

func (l *lazyHeader) Write(p []byte) (int, error) {
	if !l.sent {
		l.sent = true
		l.w.Header().Set("Content-Type", "application/x-tar")
	}
	return l.w.Write(p)
}

// postImport is POST /v1/sandboxes/import[?label=K=V...]: a bundle
// (application/x-tar) as a new suspended sandbox of the tenant (201, its
// record); POST .../resume runs it.
func (d *Daemon) postImport(w http.ResponseWriter, r *http.Request, tenant string) {
	labels, err := parseLabels(r.URL.Query()["label"])
	if err != nil {
		writeErr(w, err)
		return
	}
	start := time.Now()
	rec, err := d.importBundle(tenant, r.Body, labels)
	d.obs.ObserveOp("import", time.Since(start), err)
	if err != nil {
		writeErr(w, err)
		return
	}
	d.events.publish(tenant, wire.Event{Type: "created", Sandbox: rec.ID, Detail: "imported from a bundle"})
	writeJSON(w, http.StatusCreated, rec)
}
