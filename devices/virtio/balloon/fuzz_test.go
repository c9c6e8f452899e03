package balloon

import (
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

func newFuzzDevice(testing.TB) (virtio.Device, func()) { return New(), func() {} }

// FuzzMMIO: a hostile driver's register writes and queue contents (PFN
// arrays, report ranges, statistics) never crash the device or its
// transport (virtiotest.Hostile).
func FuzzMMIO(f *testing.F) { vt.FuzzRegisters(f, newFuzzDevice) }

// FuzzRestore: no state blob crashes a restore.
func FuzzRestore(f *testing.F) { vt.FuzzRestore(f, newFuzzDevice) }
