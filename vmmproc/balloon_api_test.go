package vmmproc

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/devices/virtio/balloon"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// serveBalloonAPI serves the control API for a VM of memMiB whose devices
// are devs (no VM: only the device routes answer) and returns its client.
func serveBalloonAPI(t *testing.T, memMiB int, devs []vmsnap.Device) vmmctl.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	stop, err := serveAPI(sock, &apiServer{opts: runOptions{MemMiB: memMiB}, forker: &cow.Forker{Devices: devs}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return vmmctl.Client{Socket: sock}
}

// TestBalloonAPI: GET and PUT /v1/balloon through vmmctl.Client read the
// device and set its target (MiB to 4 KiB pages) and statistics interval;
// a target past the guest's memory, an interval past a day, an unknown
// field and a VM without a balloon are refused.
func TestBalloonAPI(t *testing.T) {
	dev := balloon.New()
	tr := virtio.NewMMIO(balloonName, dev, make(vt.Memory, vt.MemSize), vt.NewSignals(), nil)
	defer tr.Shutdown()
	c := serveBalloonAPI(t, 64, []vmsnap.Device{{Name: "rng"}, {Name: balloonName, Transport: tr}})
	ctx := context.Background()

	rep, err := c.Balloon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.TargetMiB != 0 || rep.Active || rep.Stats == nil {
		t.Errorf("fresh balloon: %+v", rep)
	}
	iv := uint64(30)
	if rep, err = c.SetBalloon(ctx, vmmctl.BalloonRequest{TargetMiB: new(uint64(16)), StatsIntervalS: &iv}); err != nil {
		t.Fatal(err)
	}
	if rep.TargetMiB != 16 || rep.TargetPages != 16*256 || rep.StatsIntervalS != 30 {
		t.Errorf("after PUT: %+v", rep)
	}
	if info := dev.Info(); info.TargetPages != 16*256 || info.StatsInterval.Seconds() != 30 {
		t.Errorf("device: %+v", info)
	}
	if rep, err = c.SetBalloonTarget(ctx, 64); err != nil || rep.TargetMiB != 64 || rep.StatsIntervalS != 30 {
		t.Errorf("the whole memory: %+v, %v", rep, err)
	}

	var e *vmmctl.Error
	for name, req := range map[string]vmmctl.BalloonRequest{
		"past memory":   {TargetMiB: new(uint64(65))},
		"long interval": {StatsIntervalS: new(uint64(86401))},
	} {
		if _, err := c.SetBalloon(ctx, req); !errors.As(err, &e) || e.Status != http.StatusBadRequest {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := c.Do(ctx, http.MethodPut, "balloon", []byte(`{"target":1}`), nil); !errors.As(err, &e) || e.Status != http.StatusBadRequest {
		t.Errorf("unknown field: %v", err)
	}
	if dev.Info().TargetPages != 64*256 {
		t.Error("a refused request changed the target")
	}

	none := serveBalloonAPI(t, 64, []vmsnap.Device{{Name: "rng"}})
	if _, err := none.Balloon(ctx); !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Errorf("no balloon: GET %v", err)
	}
	if _, err := none.SetBalloonTarget(ctx, 1); !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Errorf("no balloon: PUT %v", err)
	}
}
