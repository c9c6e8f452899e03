package virtio_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// TestBrokenLogBounded: a hostile driver faults the device (a queue
// outside guest memory), resets it and faults it again, a thousand
// times; the VMM's log gets a bounded number of lines, not one a cycle.
func TestBrokenLogBounded(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	tr := virtio.NewMMIO("fill", &fillDev{}, make(vt.Memory, vt.MemSize), vt.NewSignals(), log)
	t.Cleanup(tr.Shutdown)
	for range 1000 {
		vt.Write32(tr, 0x070, 0)     // reset
		vt.Write32(tr, 0x070, 1|2)   // acknowledge, driver
		vt.Write32(tr, 0x030, 0)     // queue 0
		vt.Write32(tr, 0x038, 8)     // its size
		vt.Write32(tr, 0x080, 0)     // descriptors far outside memory
		vt.Write32(tr, 0x084, 0xfff) //
		vt.Write32(tr, 0x044, 1)     // ready: the queue fails validation
		if vt.Read32(tr, 0x070)&virtio.StatusNeedsReset == 0 {
			t.Fatalf("status %#x: the device was not broken", vt.Read32(tr, 0x070))
		}
	}
	n := strings.Count(buf.String(), "needs reset")
	if n == 0 || n > 8 {
		t.Fatalf("%d log lines for 1000 faults: %s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "not logged") {
		t.Errorf("the last line does not say faults are no longer logged: %s", buf.String())
	}
}
