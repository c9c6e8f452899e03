// Package blk is virtio-blk (virtio 1.x, section 5.2) on a Backend: a raw
// disk image, a regular host file whose bytes are the disk's sectors, one
// to one (New), or anything else that reads and writes at offsets, such as
// a copy-on-write overlay (NewWithBackend).
//
// # Requests
//
// Each descriptor chain is one request: a 16-byte header (type, reserved,
// sector; device-readable, possibly split across buffers), the data buffers,
// and a status byte, which is the last device-writable byte of the chain.
// Served types: IN (read), OUT (write), FLUSH (the backend's Sync: an
// fdatasync of a raw image), GET_ID (the serial from Options.ID) and, on
// writable disks, DISCARD (the backend's Discard, if it has one: holes
// punched with fallocate in a raw image; else nothing, a discard being a
// hint). Any other type completes with UNSUPP.
//
// Every field is checked before the image is touched: header length, data
// length (a multiple of 512 bytes for IN and OUT), data in the direction
// the type needs and nothing in the other one, sector ranges within the
// capacity (overflow-safe), writes to a read-only disk. A request that fails
// a check completes with IOERR (UNSUPP for an unknown type or a DISCARD with
// flags), as does a host I/O error. A chain without any writable byte has no
// room for a status: it is returned with used length 0. Only faults of the
// ring itself (what virtio.Queue.Pop reports) mark the device NEEDS_RESET.
//
// Used length is the number of bytes written into the writable buffers: the
// data read plus the status byte for a successful IN or GET_ID, 1 (the status)
// otherwise.
//
// # I/O
//
// One worker goroutine per activation owns the queue and does all the I/O,
// never on a vCPU thread: it serves requests one at a time, in ring order.
// On a raw image it uses preadv/pwritev at explicit offsets straight into
// and out of guest memory (the chain's buffers, split anywhere); on another
// backend, ReadAt/WriteAt, directly on a request's only data buffer, else
// through a bounce buffer of up to 1 MiB per call. Writes land in the host
// page cache (or wherever the backend keeps them); the guest's FLUSH makes
// them durable. A request is complete, and its used entry published,
// before the next is taken, so a quiesced device has nothing in flight to
// save.
//
// # Quiesce
//
// The worker serves requests inside service passes of the transport's gate
// (virtio.Activation.Enter/Leave): MMIO.Quiesce waits for the request in
// progress to complete and be pushed, the worker then takes no other until
// MMIO.Resume, and neither reads nor writes guest memory meanwhile.
//
// # The image
//
// New opens a regular file (block devices are not supported) whose size
// must be a multiple of 512 bytes: anything else is refused, rather than
// hiding a tail from the guest. It takes an exclusive flock (shared for a
// read-only disk), so two VMs cannot write one image, and Close releases it.
// The image is never resized. NewWithBackend takes any Backend whose size
// is a multiple of 512 bytes; locking is then the backend's business.
//
// # Swapping the backend
//
// SwapBackend puts another backend of the same size under the disk, for
// instance the new overlay of a fork in place of the image it froze. The
// device holds the current backend in an atomic pointer and the worker
// loads it once per request, so a swap is race-free; but the caller must
// have quiesced the transport (MMIO.Quiesce, or before activation or after
// Shutdown) so that no request is in flight on the old backend, and the
// guest's view of the disk must be the same on both (the device does not
// check contents).
package blk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/devices/virtio"
)

// SectorSize is the virtio-blk sector: capacity and request sectors count
// 512-byte units whatever the image's block size.
const SectorSize = 512

// IDLen is the size of the GET_ID answer (VIRTIO_BLK_ID_BYTES); a shorter
// serial is padded with NULs.
const IDLen = 20

// Feature bits (virtio 1.x, 5.2.3).
const (
	FeatureSegMax  = 1 << 2  // VIRTIO_BLK_F_SEG_MAX: seg_max in config
	FeatureRO      = 1 << 5  // VIRTIO_BLK_F_RO: the disk is read-only
	FeatureFlush   = 1 << 9  // VIRTIO_BLK_F_FLUSH: FLUSH requests
	FeatureDiscard = 1 << 13 // VIRTIO_BLK_F_DISCARD: DISCARD requests
)

// Request types (5.2.6).
const (
	TypeIn      = 0
	TypeOut     = 1
	TypeFlush   = 4
	TypeGetID   = 8
	TypeDiscard = 11
)

// Request status values (5.2.6).
const (
	StatusOK     = 0
	StatusIOErr  = 1
	StatusUnsupp = 2
)

// Limits announced in config space.
const (
	// segMax is the most data buffers per request (the header and status
	// buffers come on top), as for a full queue without indirect tables.
	segMax = virtio.MaxQueueSize - 2
	// maxDiscardSectors bounds one discard segment (1 GiB).
	maxDiscardSectors = 1 << 21
	// maxDiscardSeg is the most segments in one DISCARD request.
	maxDiscardSeg = 32
	// discardAlign is the discard granularity in sectors (4 KiB), so that
	// the guest sends ranges the host file system can actually free.
	discardAlign = 8
	// configSize is the part of struct virtio_blk_config we fill in (up to
	// and including discard_sector_alignment).
	configSize = 48
)

// Options configure a disk.
type Options struct {
	// ReadOnly opens the image read-only and offers VIRTIO_BLK_F_RO; the
	// guest's writes and discards fail with IOERR.
	ReadOnly bool
	// ID is the serial the guest reads with GET_ID (and Linux shows in
	// /sys/block/vda/serial): at most IDLen bytes.
	ID string
	// Log receives host I/O errors (the first per activation); nil means
	// slog.Default().
	Log *slog.Logger
}

// Device is one virtio-blk disk.
//
// Threads: the fields set by New are immutable, except backend, an atomic
// pointer that SwapBackend replaces. The backend is used by the worker
// goroutine (and by Close, which must come after the transport's Shutdown
// or Reset); Metrics are atomic; workers runs the worker goroutine.
type Device struct {
	// Metrics count what the device did.
	Metrics Metrics

	path     string // absolute for New; the name given to NewWithBackend
	backend  atomic.Pointer[backendRef]
	readOnly bool
	id       [IDLen]byte
	idLen    int
	capacity uint64 // in sectors
	config   [configSize]byte
	log      *slog.Logger

	workers virtio.Workers
	// serveHook, when set (tests only, before activation), runs on the
	// worker before each request is served.
	serveHook func()
}

// New opens the raw image at path and returns a disk that serves it. The
// device owns the file: Close closes it.
func New(path string, opts Options) (*Device, error) {
	if err := checkID(opts.ID); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("virtio-blk: %w", err)
	}
	flag, lock := os.O_RDWR, unix.LOCK_EX
	if opts.ReadOnly {
		flag, lock = os.O_RDONLY, unix.LOCK_SH
	}
	f, err := os.OpenFile(abs, flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("virtio-blk: open image: %w", err)
	}
	d, err := newDevice(f, abs, lock, opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	return d, nil
}

func newDevice(f *os.File, path string, lock int, opts Options) (*Device, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("virtio-blk: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("virtio-blk: %s is not a regular file (%s); only raw image files are supported", path, fi.Mode().Type())
	}
	if fi.Size()%SectorSize != 0 {
		return nil, fmt.Errorf("virtio-blk: %s is %d bytes, not a multiple of %d", path, fi.Size(), SectorSize)
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("virtio-blk: %w", err)
	}
	var lockErr error
	if err := raw.Control(func(fd uintptr) { lockErr = unix.Flock(int(fd), lock|unix.LOCK_NB) }); err != nil {
		return nil, fmt.Errorf("virtio-blk: %w", err)
	}
	if errors.Is(lockErr, unix.EWOULDBLOCK) {
		return nil, fmt.Errorf("virtio-blk: %s is in use (locked by another disk or process)", path)
	} else if lockErr != nil {
		return nil, fmt.Errorf("virtio-blk: flock %s: %w", path, lockErr)
	}
	return newDev(&fileBackend{f: f, raw: raw, size: fi.Size(), readOnly: opts.ReadOnly}, path, opts), nil
}

// NewWithBackend returns a disk that serves b, whose size must be a
// multiple of SectorSize. name identifies the disk in messages and in its
// saved state (Path). The device owns b from now on (Close closes it),
// until SwapBackend hands it back. With opts.ReadOnly the device refuses
// the guest's writes whatever b allows.
func NewWithBackend(b Backend, name string, opts Options) (*Device, error) {
	if err := checkID(opts.ID); err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("virtio-blk: %s: no backend", name)
	}
	if size := b.Size(); size < 0 || size%SectorSize != 0 {
		return nil, fmt.Errorf("virtio-blk: %s is %d bytes, not a multiple of %d", name, size, SectorSize)
	}
	return newDev(b, name, opts), nil
}

func checkID(id string) error {
	if len(id) > IDLen {
		return fmt.Errorf("virtio-blk: ID %q is longer than %d bytes", id, IDLen)
	}
	return nil
}

// newDev makes the device over b, whose size has been checked.
func newDev(b Backend, name string, opts Options) *Device {
	d := &Device{path: name, readOnly: opts.ReadOnly, capacity: uint64(b.Size()) / SectorSize, log: opts.Log}
	d.backend.Store(newBackendRef(b))
	if d.log == nil {
		d.log = slog.Default()
	}
	d.idLen = copy(d.id[:], opts.ID)
	d.fillConfig()
	return d
}

// Backend is the backend the disk serves now.
func (d *Device) Backend() Backend { return d.backend.Load().b }

// SwapBackend makes the disk serve b from the next request on, and
// returns the backend it served, which it no longer owns and does not
// close. b must have the disk's size; the device owns it from now on.
//
// The caller guarantees that no request is in flight: the transport is
// quiesced (MMIO.Quiesce until MMIO.Resume), not yet activated, or shut
// down. (A swap during a request is memory-safe, the worker reading the
// backend once per request, but that request would still go to the old
// backend, which the caller might close under it.)
func (d *Device) SwapBackend(b Backend) (old Backend, err error) {
	if b == nil {
		return nil, fmt.Errorf("virtio-blk: swap backend of %s: no backend", d.path)
	}
	if size := b.Size(); size < 0 || uint64(size) != d.capacity*SectorSize {
		return nil, fmt.Errorf("virtio-blk: swap backend of %s: new backend is %d bytes, the disk %d", d.path, size, d.capacity*SectorSize)
	}
	return d.backend.Swap(newBackendRef(b)).b, nil
}

// fillConfig lays out struct virtio_blk_config (5.2.4), little-endian.
func (d *Device) fillConfig() {
	le := binary.LittleEndian
	c := d.config[:]
	le.PutUint64(c[0:], d.capacity)
	le.PutUint32(c[12:], segMax)
	if !d.readOnly {
		le.PutUint32(c[36:], maxDiscardSectors)
		le.PutUint32(c[40:], maxDiscardSeg)
		le.PutUint32(c[44:], discardAlign)
	}
}

// Close closes the backend: a raw image from New is released with its
// lock. Call it after the transport's Shutdown: a running worker would see
// its I/O fail.
func (d *Device) Close() error {
	if err := d.Backend().Close(); err != nil {
		return fmt.Errorf("virtio-blk: close %s: %w", d.path, err)
	}
	return nil
}

// Path is the absolute path of the image given to New, or the name given
// to NewWithBackend (a swap does not change it).
func (d *Device) Path() string { return d.path }

// Capacity is the disk size in 512-byte sectors.
func (d *Device) Capacity() uint64 { return d.capacity }

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.TypeBlock }

// Features implements virtio.Device.
func (d *Device) Features() uint64 {
	f := uint64(virtio.FeatureIndirectDesc | virtio.FeatureEventIdx | FeatureSegMax | FeatureFlush)
	if d.readOnly {
		f |= FeatureRO
	} else {
		f |= FeatureDiscard
	}
	return f
}

// QueueSizes implements virtio.Device: one request queue.
func (d *Device) QueueSizes() []uint16 { return []uint16{virtio.MaxQueueSize} }

// ReadConfig implements virtio.Device. Bytes past the fields we fill in
// read as zero.
func (d *Device) ReadConfig(off uint64, data []byte) {
	clear(data)
	if off < configSize {
		copy(data, d.config[off:])
	}
}

// WriteConfig implements virtio.Device: nothing in our config space is
// writable (no VIRTIO_BLK_F_CONFIG_WCE), so writes are ignored.
func (d *Device) WriteConfig(off uint64, data []byte) {}
