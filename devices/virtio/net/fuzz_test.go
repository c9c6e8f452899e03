package vnet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// sink is a Backend that records what the device writes.
type sink struct{ pkts [][]byte }

func (s *sink) Name() string               { return "sink" }
func (s *sink) Read(p []byte) (int, error) { return 0, io.EOF }
func (s *sink) Write(p []byte) (int, error) {
	s.pkts = append(s.pkts, bytes.Clone(p))
	return len(p), nil
}
func (s *sink) SetReadDeadline(time.Time) error  { return nil }
func (s *sink) SetWriteDeadline(time.Time) error { return nil }
func (s *sink) Close() error                     { return nil }

// txChainFromBytes decodes a fuzz input into a transmit chain: byte 0 picks
// 1–6 buffers, then 3 bytes per buffer (le16 length, flags: bit 0 makes it
// device-writable); the remaining bytes, repeated, fill the buffers.
func txChainFromBytes(data []byte) *virtio.Chain {
	c := &virtio.Chain{Head: 3}
	if len(data) == 0 {
		return c
	}
	n := 1 + int(data[0])%6
	data = data[1:]
	type seg struct {
		len      int
		writable bool
	}
	var segs []seg
	for i := 0; i < n && len(data) >= 3; i++ {
		segs = append(segs, seg{int(binary.LittleEndian.Uint16(data)), data[2]&1 != 0})
		data = data[3:]
	}
	fill := data
	if len(fill) == 0 {
		fill = []byte{0xa5}
	}
	k := 0
	for _, s := range segs {
		b := make([]byte, s.len)
		for i := range b {
			b[i] = fill[k%len(fill)]
			k++
		}
		if s.writable {
			c.Writable = append(c.Writable, b)
		} else {
			c.Readable = append(c.Readable, b)
		}
	}
	return c
}

// FuzzTxChain feeds arbitrary transmit chains to the transmit path and
// checks that it writes exactly the frame behind a zeroed header, drops
// runts, and reports every malformed chain as a driver fault.
func FuzzTxChain(f *testing.F) {
	f.Add([]byte{0, 74, 0, 0, 0xff}) // one 74-byte buffer of 0xff
	s := &sink{}
	dev, err := NewBackend(s, guestMAC, Options{})
	if err != nil {
		f.Fatal(err)
	}
	stop := make(chan struct{})
	f.Fuzz(func(t *testing.T, data []byte) {
		s.pkts = s.pkts[:0]
		drops := dev.Metrics.TxDrops.Load()
		c := txChainFromBytes(data)
		err := dev.transmit(c, stop)
		var all []byte
		for _, b := range c.Readable {
			all = append(all, b...)
		}
		switch {
		case len(c.Writable) > 0, len(all) < HeaderLen, len(all)-HeaderLen > MaxFrame:
			if !errors.Is(err, virtio.ErrBroken) {
				t.Fatalf("malformed chain (%d readable bytes, %d writable buffers): err %v", len(all), len(c.Writable), err)
			}
			if len(s.pkts) != 0 {
				t.Fatal("malformed chain written to the backend")
			}
		case len(all)-HeaderLen < minFrame:
			if err != nil || len(s.pkts) != 0 || dev.Metrics.TxDrops.Load() != drops+1 {
				t.Fatalf("runt of %d bytes: err %v, %d written, drops %d", len(all)-HeaderLen, err, len(s.pkts), dev.Metrics.TxDrops.Load()-drops)
			}
		default:
			if err != nil || len(s.pkts) != 1 {
				t.Fatalf("frame of %d bytes: err %v, %d written", len(all)-HeaderLen, err, len(s.pkts))
			}
			want := append(make([]byte, HeaderLen), all[HeaderLen:]...)
			if !bytes.Equal(s.pkts[0], want) {
				t.Fatal("written packet differs from the chain's frame behind a zero header")
			}
		}
	})
}

// newFuzzDevice is a device on one end of a socket pair (frames the
// guest sends are queued there, unread; nothing arrives).
func newFuzzDevice(t testing.TB) (virtio.Device, func()) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := os.NewFile(uintptr(fds[1]), "peer")
	dev, err := NewBackend(os.NewFile(uintptr(fds[0]), "fuzz0"), guestMAC, Options{QueueSize: 16})
	if err != nil {
		peer.Close()
		t.Fatal(err)
	}
	return dev, func() { dev.Close(); peer.Close() }
}

// FuzzMMIO: a hostile driver's register writes and queue contents never
// crash the device or its transport (virtiotest.Hostile).
func FuzzMMIO(f *testing.F) { vt.FuzzRegisters(f, newFuzzDevice) }

// FuzzRestore: no state blob crashes a restore.
func FuzzRestore(f *testing.F) { vt.FuzzRestore(f, newFuzzDevice) }
