package vsock

import (
	"net"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// newFuzzDevice is a device with one service (port 52, closing every
// connection), so that a fuzzed guest can connect to something.
func newFuzzDevice(testing.TB) (virtio.Device, func()) {
	return &Device{CID: guestCID, BufAlloc: 16, Services: map[uint32]func(net.Conn){52: func(c net.Conn) { c.Close() }}}, func() {}
}

// FuzzMMIO: a hostile driver's register writes and queue contents never
// crash the device or its transport (virtiotest.Hostile).
func FuzzMMIO(f *testing.F) { vt.FuzzRegisters(f, newFuzzDevice) }

// FuzzRestore: no state blob crashes a restore.
func FuzzRestore(f *testing.F) { vt.FuzzRestore(f, newFuzzDevice) }
