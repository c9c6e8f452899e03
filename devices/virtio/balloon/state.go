package balloon

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
)

// stateVersion versions the device's own saved state.
const stateVersion = 1

// maxStatsInterval bounds a restored statistics interval.
const maxStatsInterval = 24 * time.Hour

// state is the device's own saved state (the transport saves the queues).
type state struct {
	Version int `json:"version"`
	// TargetPages and ActualPages are the configuration space.
	TargetPages uint32 `json:"target_pages"`
	ActualPages uint32 `json:"actual_pages"`
	// StatsIntervalMS is the host's statistics interval (0: none).
	StatsIntervalMS int64 `json:"stats_interval_ms,omitempty"`
	// Stats and StatsTime are the latest statistics and when they came.
	Stats     []Stat    `json:"stats,omitempty"`
	StatsTime time.Time `json:"stats_time,omitzero"`
	// HeldStats is the head of the statistics buffer the device held
	// (absent: none): the one chain of the stats queue popped and not
	// pushed at the save.
	HeldStats *uint16 `json:"held_stats,omitempty"`
	*Metrics
}

// SaveState implements virtio.Stateful: the configuration, the statistics
// and their interval, the held statistics buffer and the counters. The
// device is quiesced or stopped (virtio.MMIO.Save).
func (d *Device) SaveState() (json.RawMessage, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := state{Version: stateVersion, TargetPages: d.target, ActualPages: d.actual,
		StatsIntervalMS: d.interval.Milliseconds(), Stats: d.stats, StatsTime: d.statsAt, Metrics: &d.Metrics}
	if d.holding {
		h := d.held
		s.HeldStats = &h
	}
	return json.Marshal(s)
}

// RestoreState implements virtio.Stateful. It refuses a state of another
// version, more than MaxStats statistics or an interval out of range
// before changing anything. Whether the held buffer is still out is
// checked when the transport activates the device.
func (d *Device) RestoreState(raw json.RawMessage) error {
	s := state{Metrics: new(Metrics)}
	if err := virtio.DecodeState(raw, "virtio-balloon", &s, &s.Version, stateVersion); err != nil {
		return err
	}
	if len(s.Stats) > MaxStats {
		return fmt.Errorf("virtio-balloon state: %d statistics, at most %d", len(s.Stats), MaxStats)
	}
	iv := time.Duration(s.StatsIntervalMS) * time.Millisecond
	if s.StatsIntervalMS < 0 || s.StatsIntervalMS > maxStatsInterval.Milliseconds() || (iv != 0 && iv < MinStatsInterval) {
		return fmt.Errorf("virtio-balloon state: statistics interval %d ms out of range", s.StatsIntervalMS)
	}
	d.mu.Lock()
	d.target, d.actual, d.interval = s.TargetPages, s.ActualPages, iv
	d.stats, d.statsAt = s.Stats, s.StatsTime
	d.holding = s.HeldStats != nil
	if d.holding {
		d.held = *s.HeldStats
	}
	d.mu.Unlock()
	virtio.RestoreCounters(&d.Metrics, s.Metrics)
	return nil
}
