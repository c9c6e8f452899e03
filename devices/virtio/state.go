package virtio

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"sync/atomic"
)

// StateVersion is the version of TransportState this code writes and reads.
const StateVersion = 1

// QueueState is a queue's driver configuration and device progress.
type QueueState struct {
	MaxSize   uint16 `json:"max_size"`
	Size      uint16 `json:"size"`
	Ready     bool   `json:"ready"`
	Desc      uint64 `json:"desc"`
	Avail     uint64 `json:"avail"`
	Used      uint64 `json:"used"`
	EventIdx  bool   `json:"event_idx"`
	NextAvail uint16 `json:"next_avail"`
	NextUsed  uint16 `json:"next_used"`
	Signalled uint16 `json:"signalled_used"`
}

// TransportState is everything a virtio-mmio device needs to resume: the
// transport registers, the queues, and the device model's own state.
type TransportState struct {
	Version        int             `json:"version"`
	DeviceType     uint32          `json:"device_type"`
	Status         uint32          `json:"status"`
	DriverFeatures uint64          `json:"driver_features"`
	DevFeatSel     uint32          `json:"device_features_sel"`
	DrvFeatSel     uint32          `json:"driver_features_sel"`
	QueueSel       uint32          `json:"queue_sel"`
	IntStatus      uint32          `json:"interrupt_status"`
	ConfigGen      uint32          `json:"config_generation"`
	Queues         []QueueState    `json:"queues"`
	Device         json.RawMessage `json:"device,omitempty"`
}

// Stateful is implemented by devices with state of their own (config,
// counters, backend identity) to carry across save/restore.
type Stateful interface {
	SaveState() (json.RawMessage, error)
	RestoreState(json.RawMessage) error
}

// DecodeState decodes a device's own saved state raw into s, whose
// version field is *version, and checks that the version is want. Its
// errors begin with what, the device ("virtio-blk").
func DecodeState(raw json.RawMessage, what string, s any, version *int, want int) error {
	if err := json.Unmarshal(raw, s); err != nil {
		return fmt.Errorf("%s state: %w", what, err)
	}
	if *version != want {
		return fmt.Errorf("%s state version %d, this build reads %d", what, *version, want)
	}
	return nil
}

// Counter is a device counter that an operator reads at any time and that
// the device's saved state carries: a device's Metrics struct, embedded
// in its saved state, encodes each Counter as a JSON number.
type Counter struct{ atomic.Uint64 }

// MarshalJSON implements json.Marshaler: the counter's value.
func (c *Counter) MarshalJSON() ([]byte, error) {
	return strconv.AppendUint(nil, c.Load(), 10), nil
}

// UnmarshalJSON implements json.Unmarshaler: it sets the counter.
func (c *Counter) UnmarshalJSON(b []byte) error {
	var v uint64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	c.Store(v)
	return nil
}

var counterType = reflect.TypeFor[Counter]()

// RestoreCounters sets every Counter field of *dst to its value in *src:
// M is a device's Metrics struct, src the one decoded from a saved state.
func RestoreCounters[M any](dst, src *M) {
	d, s := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	for i := range d.NumField() {
		if d.Field(i).Type() == counterType {
			d.Field(i).Addr().Interface().(*Counter).Store(s.Field(i).Addr().Interface().(*Counter).Load())
		}
	}
}

func saveQueue(q *Queue) QueueState {
	return QueueState{q.MaxSize, q.Size, q.Ready, q.Desc, q.Avail, q.Used, q.EventIdx, q.NextAvail, q.NextUsed, q.signalledUsed}
}

func restoreQueue(q *Queue, s QueueState) {
	*q = Queue{MaxSize: s.MaxSize, Size: s.Size, Ready: s.Ready, Desc: s.Desc, Avail: s.Avail, Used: s.Used,
		EventIdx: s.EventIdx, NextAvail: s.NextAvail, NextUsed: s.NextUsed, signalledUsed: s.Signalled}
}

// Save captures the transport's state. The VM must be paused (no vCPU in
// the transport) and the device quiet: quiesced (Quiesce, and the VM may
// resume after Save with Resume), or stopped (Shutdown, or not activated).
// At that point every chain the device popped has been pushed, so the
// queues' NextAvail and NextUsed agree with the rings in guest memory, and
// a copy of guest memory taken before Resume matches the state: Restore
// over that copy continues the rings where they were. Host-side data the
// device held and had not yet put into guest memory (a received frame, a
// vsock chunk) is not part of the state.
func (t *MMIO) Save() (TransportState, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := TransportState{Version: StateVersion, DeviceType: t.dev.Type(), Status: t.status,
		DriverFeatures: t.drvFeatures, DevFeatSel: t.devFeatSel, DrvFeatSel: t.drvFeatSel,
		QueueSel: t.queueSel, IntStatus: t.intStatus, ConfigGen: t.configGen}
	for _, q := range t.queues {
		s.Queues = append(s.Queues, saveQueue(q))
	}
	if d, ok := t.dev.(Stateful); ok {
		raw, err := d.SaveState()
		if err != nil {
			return s, fmt.Errorf("virtio: save %s: %w", t.name, err)
		}
		s.Device = raw
	}
	return s, nil
}

// Restore loads a saved state into the transport and re-activates the
// device when the driver had it running, with a kick on every queue. The
// transport is fresh (a restore) or in use and quiesced, with the vCPUs
// parked (an in-place rollback): it is then reset first, and the new
// activation stays quiesced until Resume. It refuses a state of another
// version, device type or queue layout before changing anything.
func (t *MMIO) Restore(s TransportState) error {
	if s.Version != StateVersion {
		return fmt.Errorf("virtio: %s: state version %d, this build reads %d", t.name, s.Version, StateVersion)
	}
	if s.DeviceType != t.dev.Type() {
		return fmt.Errorf("virtio: %s: state is for device type %d, device is %d", t.name, s.DeviceType, t.dev.Type())
	}
	if len(s.Queues) != len(t.queues) {
		return fmt.Errorf("virtio: %s: state has %d queues, device has %d", t.name, len(s.Queues), len(t.queues))
	}
	for i, q := range s.Queues {
		if q.MaxSize != t.queues[i].MaxSize {
			return fmt.Errorf("virtio: %s: queue %d max size %d in state, %d in device", t.name, i, q.MaxSize, t.queues[i].MaxSize)
		}
		if q.Ready {
			tmp := &Queue{}
			restoreQueue(tmp, q)
			if err := tmp.Validate(t.mem); err != nil {
				return fmt.Errorf("virtio: %s: queue %d: %w", t.name, i, err)
			}
		}
	}
	// A transport that is in use (an in-place rollback) is reset first:
	// its workers stop and the device forgets its activation, as on a
	// driver reset. A quiesced transport stays quiesced: the activation
	// below starts with its gate shut, and Resume opens it.
	t.mu.Lock()
	t.reset()
	t.mu.Unlock()
	if d, ok := t.dev.(Stateful); ok && len(s.Device) > 0 {
		if err := d.RestoreState(s.Device); err != nil {
			return fmt.Errorf("virtio: restore %s: %w", t.name, err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.status, t.drvFeatures, t.devFeatSel, t.drvFeatSel = s.Status, s.DriverFeatures, s.DevFeatSel, s.DrvFeatSel
	t.queueSel, t.intStatus, t.configGen = s.QueueSel, s.IntStatus, s.ConfigGen
	for i := range t.queues {
		restoreQueue(t.queues[i], s.Queues[i])
	}
	if t.status&StatusDriverOK != 0 && t.status&StatusNeedsReset == 0 {
		if err := t.activate(); err != nil {
			return fmt.Errorf("virtio: %s: re-activate: %w", t.name, err)
		}
		for i := range t.kicks {
			t.Notify(uint32(i)) // look for buffers made available while saved
		}
	}
	return nil
}
