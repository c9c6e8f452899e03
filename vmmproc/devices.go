package vmmproc

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/devices/virtio/balloon"
	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmmctl"
)

type diskSpec struct {
	path     string
	readOnly bool
	// name, when set, is the device's name instead of path (see
	// diskOption.Name).
	name string
}

// ParseMAC parses a unicast MAC, or makes a random locally administered one
// when s is empty.
func ParseMAC(s string) (net.HardwareAddr, error) {
	if s == "" {
		mac := make(net.HardwareAddr, 6)
		if _, err := rand.Read(mac); err != nil {
			return nil, err
		}
		mac[0] = mac[0]&^1 | 2 // unicast, locally administered
		return mac, nil
	}
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("--mac %q is not a 6-byte MAC address", s)
	}
	if mac[0]&1 != 0 {
		return nil, fmt.Errorf("--mac %s is a multicast address", s)
	}
	return mac, nil
}

// The memory balloon (`warren run --balloon`; devices/virtio/balloon):
// free page reporting gives the memory an idle guest frees back to the
// host, and the control API (GET and PUT /v1/balloon, vmmctl's
// BalloonRequest and BalloonReply) reads its state and sets its target.
// It is the VM's last virtio device, so that every other device keeps
// its MMIO window and interrupt line with or without it.

// balloonName is the balloon's device (and transport) name.
const balloonName = "balloon"

// balloonSpec puts dev behind its virtio-mmio transport, as virtioSpec
// does, and makes the transport's ConfigChanged the device's notifier, so
// that a new target reaches the guest's driver. mmios records the
// transport under balloonName when the VM creates it.
func balloonSpec(dev *balloon.Device, log *slog.Logger, mmios map[string]*virtio.MMIO) vmm.VirtioSpec {
	s := virtioSpec(balloonName, balloon.NumQueues, dev, log, mmios)
	newTransport := s.New
	s.New = func(mem *guestmem.Memory, irq vmm.Signaller) (vmm.VirtioTransport, error) {
		t, err := newTransport(mem, irq)
		if err == nil {
			dev.SetNotifier(mmios[balloonName].ConfigChanged)
		}
		return t, err
	}
	return s
}

// maxStatsIntervalS bounds PUT /v1/balloon's stats_interval_s.
const maxStatsIntervalS = 86400

// balloon returns the VM's balloon (nil: none).
func (a *apiServer) balloon() *balloon.Device {
	if a.forker == nil {
		return nil
	}
	return balloonOf(a.forker.Devices)
}

// balloonOf returns the balloon among a VM's devices (nil: none).
func balloonOf(devs []vmsnap.Device) *balloon.Device {
	for _, d := range devs {
		if t, ok := d.Transport.(*virtio.MMIO); ok {
			if b, ok := t.Device().(*balloon.Device); ok {
				return b
			}
		}
	}
	return nil
}

// balloonReply is the API's view of dev.
func balloonReply(dev *balloon.Device) vmmctl.BalloonReply {
	info := dev.Info()
	m := &dev.Metrics
	r := vmmctl.BalloonReply{
		TargetMiB: uint64(info.TargetPages) * balloon.PageSize >> 20, TargetPages: info.TargetPages,
		ActualMiB: uint64(info.ActualPages) * balloon.PageSize >> 20, ActualPages: info.ActualPages,
		Active:            info.Active,
		FreePageReporting: info.Active && info.Features&balloon.FeatureFreePageReporting != 0,
		StatsQueue:        info.Active && info.Features&balloon.FeatureStatsVQ != 0,
		StatsIntervalS:    info.StatsInterval.Seconds(), Stats: []vmmctl.BalloonStat{}, StatsTime: info.StatsTime,
		Counters: vmmctl.BalloonCounters{
			InflatedPages: m.InflatedPages.Load(), DeflatedPages: m.DeflatedPages.Load(),
			InflateDiscardedPages: m.InflateDiscardedPages.Load(), Reports: m.Reports.Load(),
			ReportedBytes: m.ReportedBytes.Load(), ReportDiscardedBytes: m.ReportDiscardedBytes.Load(),
			StatsUpdates: m.StatsUpdates.Load(), Errors: m.Errors.Load(), DiscardErrors: m.DiscardErrors.Load(),
		},
	}
	for _, s := range info.Stats {
		r.Stats = append(r.Stats, vmmctl.BalloonStat{Tag: s.Tag, Name: s.Name(), Value: s.Value})
	}
	return r
}

// errNoBalloon answers a VM without a balloon.
var errNoBalloon = errors.New("balloon: this VM has no balloon (warren run --balloon)")

// getBalloon is GET /v1/balloon.
func (a *apiServer) getBalloon(w http.ResponseWriter, r *http.Request) {
	dev := a.balloon()
	if dev == nil {
		replyErr(w, http.StatusNotFound, errNoBalloon)
		return
	}
	reply(w, http.StatusOK, balloonReply(dev))
}

// putBalloon is PUT /v1/balloon: a new target (at most the guest's
// memory) and statistics interval, in force when it answers; the guest's
// driver follows the target at its own pace.
func (a *apiServer) putBalloon(w http.ResponseWriter, r *http.Request) {
	dev := a.balloon()
	if dev == nil {
		replyErr(w, http.StatusNotFound, errNoBalloon)
		return
	}
	var req vmmctl.BalloonRequest
	if err := strictjson.Decode(io.LimitReader(r.Body, 1<<16), &req); err != nil {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("bad request: %w", err))
		return
	}
	if req.TargetMiB != nil && *req.TargetMiB > uint64(a.opts.MemMiB) {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("balloon: target %d MiB is more than the guest's %d MiB", *req.TargetMiB, a.opts.MemMiB))
		return
	}
	if req.StatsIntervalS != nil {
		if *req.StatsIntervalS > maxStatsIntervalS {
			replyErr(w, http.StatusBadRequest, fmt.Errorf("balloon: statistics interval %d s: at most %d", *req.StatsIntervalS, maxStatsIntervalS))
			return
		}
		if err := dev.SetStatsInterval(time.Duration(*req.StatsIntervalS) * time.Second); err != nil {
			replyErr(w, http.StatusBadRequest, err)
			return
		}
	}
	if req.TargetMiB != nil {
		dev.SetTarget(uint32(*req.TargetMiB << 20 / balloon.PageSize))
	}
	reply(w, http.StatusOK, balloonReply(dev))
}
