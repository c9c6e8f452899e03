package vnet

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

var guestMAC = net.HardwareAddr{0x02, 0x57, 0x41, 0x52, 0x00, 0x01}

const (
	featMrg   = virtio.FeatureVersion1 | FeatureMAC | FeatureStatus | FeatureMrgRxbuf | virtio.FeatureEventIdx
	featNoMrg = virtio.FeatureVersion1 | FeatureMAC
)

// countingFile is a backend that counts the reads the device makes.
type countingFile struct {
	*os.File
	reads atomic.Int64
}

func (c *countingFile) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.File.Read(p)
}

// fakeTap returns a message-oriented backend (one end of a SOCK_SEQPACKET
// socketpair) and the test's end of it.
func fakeTap(t *testing.T) (*countingFile, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := os.NewFile(uintptr(fds[1]), "peer")
	t.Cleanup(func() { peer.Close() })
	return &countingFile{File: os.NewFile(uintptr(fds[0]), "fake0")}, peer
}

// rig is a device behind a virtio-mmio transport in fake guest memory.
type rig struct {
	dev    *Device
	tr     *virtio.MMIO
	mem    vt.Memory
	rx, tx *vt.Driver
	irq    *vt.Signals
}

func newRig(t *testing.T, b Backend, features uint64) *rig {
	t.Helper()
	dev, err := NewBackend(b, guestMAC, Options{QueueSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	r := &rig{dev: dev, mem: make(vt.Memory, vt.MemSize), irq: vt.NewSignals()}
	r.tr = virtio.NewMMIO("net", dev, r.mem, r.irq, nil)
	t.Cleanup(r.tr.Shutdown)
	r.bring(t, features)
	return r
}

// bring (re)initialises the device as a driver would, with fresh queues.
func (r *rig) bring(t *testing.T, features uint64) {
	t.Helper()
	clear(r.mem)
	r.rx, r.tx = vt.NewDriver(r.mem, rxQueue, 16), vt.NewDriver(r.mem, txQueue, 16)
	st := vt.Bring(r.tr, features, r.rx, r.tx)
	if st&virtio.StatusDriverOK == 0 || st&virtio.StatusNeedsReset != 0 {
		t.Fatalf("status %#x", st)
	}
}

func waitUsed(t *testing.T, d *vt.Driver, n int) [][2]uint32 { return vt.WaitUsed(t, d, n) }

// frame builds an Ethernet frame of n bytes (n >= 14) with a recognisable
// payload.
func frame(dst, src net.HardwareAddr, n int, seed byte) []byte {
	f := make([]byte, n)
	copy(f, dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], 0x88b5) // local experimental EtherType
	for i := 14; i < n; i++ {
		f[i] = seed + byte(i)
	}
	return f
}

// wantFrames waits for one used entry per receive buffer at addrs and
// checks that buffer i holds frame i of size bytes (frame(guestMAC,
// hostMAC, size, i)): none lost, reordered or corrupted.
func (r *rig) wantFrames(t *testing.T, addrs []uint64, size int) {
	t.Helper()
	waitUsed(t, r.rx, len(addrs))
	for i, a := range addrs {
		if !bytes.Equal(r.mem[a+HeaderLen:a+HeaderLen+uint64(size)], frame(guestMAC, hostMAC, size, byte(i))) {
			t.Fatalf("frame %d lost, out of order or corrupted", i)
		}
	}
}

// withHeader prefixes f with a virtio-net header full of junk.
func withHeader(f []byte) []byte {
	return append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, f...)
}
