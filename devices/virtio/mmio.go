package virtio

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"

	reg "github.com/warrenvm/warren/internal/virtiommio"
)

const (
	mmioMagic   = 0x74726976 // "virt"
	mmioVersion = 2
	vendorID    = 0x5741_5252 // "WARR"

	// MMIOSize is the size of one device's register window.
	MMIOSize = 0x1000

	// NotifyOffset is the QueueNotify register offset, for ioeventfd.
	NotifyOffset = reg.QueueNotify

	intUsedBuffer   = 1
	intConfigChange = 2
)

// Signaller raises the device's interrupt line (an irqfd or an IRQ pulse).
type Signaller interface {
	Signal() error
}

// MMIO is the virtio-mmio transport for one device. Its Read and Write are
// called from vCPU threads; mu serialises them with device callbacks.
// Quiesce and Resume (serialised by qmu) hold the device's workers at a
// safe point for a snapshot; Save is then valid.
type MMIO struct {
	// qmu serialises Quiesce and Resume; it is taken before mu.
	qmu sync.Mutex
	mu  sync.Mutex
	// signals counts the configuration-change interrupts broken sends
	// asynchronously; Quiesce waits for them.
	signals sync.WaitGroup

	// Immutable after NewMMIO.
	dev  Device
	mem  Memory
	irq  Signaller
	log  *slog.Logger
	name string

	// mu guards the fields below (the Queues too, while the device is not
	// activated; see Queue).
	status       uint32
	devFeatSel   uint32
	drvFeatSel   uint32
	drvFeatures  uint64
	queueSel     uint32
	queues       []*Queue
	kicks        []chan struct{}
	intStatus    uint32
	configGen    uint32
	activated    bool
	brokenLogged bool
	// brokenLogs counts the faults logged over the device's life: a
	// guest that faults and resets the device in a loop logs at most
	// maxBrokenLogs lines, not one a cycle.
	brokenLogs int
	// resetting is closed when an asynchronous device Reset started by
	// broken has finished; activate and reset wait for it.
	resetting chan struct{}
	// gate is the current activation's pass gate (nil before the first).
	gate *gate
	// quiesced: Quiesce succeeded and Resume has not been called. An
	// activation made while quiesced starts with its gate closed.
	quiesced bool
}

// NewMMIO wraps dev in a transport. irq raises its interrupt; mem is guest
// RAM.
func NewMMIO(name string, dev Device, mem Memory, irq Signaller, log *slog.Logger) *MMIO {
	if log == nil {
		log = slog.Default()
	}
	t := &MMIO{dev: dev, mem: mem, irq: irq, log: log, name: name}
	for _, n := range dev.QueueSizes() {
		t.queues = append(t.queues, &Queue{MaxSize: n, Size: n})
		t.kicks = append(t.kicks, make(chan struct{}, 1))
	}
	return t
}

// Device returns the wrapped device.
func (t *MMIO) Device() Device { return t.dev }

// Status returns the device status register.
func (t *MMIO) Status() uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.status
}

func (t *MMIO) features() uint64 { return t.dev.Features() | FeatureVersion1 }

// Notify delivers a driver notification for queue q (from an ioeventfd
// reader or a QueueNotify write). Never blocks.
func (t *MMIO) Notify(q uint32) {
	if int(q) < len(t.kicks) {
		select {
		case t.kicks[q] <- struct{}{}:
		default:
		}
	}
}

// isRegister is the start of Read and Write: an access to the device's
// config space (off from reg.Config) goes to config, the device's
// ReadConfig or WriteConfig, under t.mu; of the rest, only 32-bit accesses
// to 32-bit registers are served (isRegister returns true), others are
// ignored.
func (t *MMIO) isRegister(off uint64, data []byte, config func(off uint64, data []byte)) bool {
	if off >= reg.Config {
		t.mu.Lock()
		config(off-reg.Config, data)
		t.mu.Unlock()
		return false
	}
	return len(data) == 4 && off%4 == 0
}

// Read handles a guest read of the register window.
func (t *MMIO) Read(off uint64, data []byte) {
	clear(data) // what no register or config field gives reads as zero
	if !t.isRegister(off, data, t.dev.ReadConfig) {
		return
	}
	t.mu.Lock()
	v := t.readReg(off)
	t.mu.Unlock()
	binary.LittleEndian.PutUint32(data, v)
}

func (t *MMIO) readReg(off uint64) uint32 {
	q := t.selected()
	switch off {
	case reg.Magic:
		return mmioMagic
	case reg.Version:
		return mmioVersion
	case reg.DeviceID:
		return t.dev.Type()
	case reg.VendorID:
		return vendorID
	case reg.DeviceFeatures:
		if t.devFeatSel > 1 {
			return 0
		}
		return uint32(t.features() >> (32 * t.devFeatSel))
	case reg.QueueNumMax:
		if q == nil {
			return 0
		}
		return uint32(q.MaxSize)
	case reg.QueueReady:
		if q != nil && q.Ready {
			return 1
		}
		return 0
	case reg.InterruptStatus:
		return t.intStatus
	case reg.Status:
		return t.status
	case reg.ConfigGeneration:
		return t.configGen
	}
	return 0
}

// Write handles a guest write to the register window.
func (t *MMIO) Write(off uint64, data []byte) {
	if !t.isRegister(off, data, t.dev.WriteConfig) {
		return
	}
	v := binary.LittleEndian.Uint32(data)
	if off == reg.QueueNotify {
		t.Notify(v)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.selected()
	configurable := q != nil && !q.Ready && t.status&StatusDriverOK == 0
	switch off {
	case reg.DeviceFeaturesSel:
		t.devFeatSel = v
	case reg.DriverFeaturesSel:
		t.drvFeatSel = v
	case reg.DriverFeatures:
		if t.status&StatusFeaturesOK == 0 && t.drvFeatSel <= 1 {
			shift := 32 * t.drvFeatSel
			t.drvFeatures = t.drvFeatures&^(0xffffffff<<shift) | uint64(v)<<shift
		}
	case reg.QueueSel:
		t.queueSel = v
	case reg.QueueNum:
		if configurable {
			q.Size = uint16(min(v, 0xffff))
		}
	case reg.QueueReady:
		if q == nil {
			return
		}
		if v == 0 {
			q.Ready = false
		} else if configurable {
			if err := q.Validate(t.mem); err != nil {
				t.broken(err)
				return
			}
			q.Ready = true
		}
	case reg.QueueDescLow, reg.QueueDescHigh, reg.QueueDriverLow, reg.QueueDriverHigh, reg.QueueDeviceLow, reg.QueueDeviceHigh:
		if configurable {
			setHalf(queueAddr(q, off), off, v)
		}
	case reg.InterruptACK:
		t.intStatus &^= v
	case reg.Status:
		t.setStatus(v)
	}
}

func queueAddr(q *Queue, off uint64) *uint64 {
	switch off {
	case reg.QueueDescLow, reg.QueueDescHigh:
		return &q.Desc
	case reg.QueueDriverLow, reg.QueueDriverHigh:
		return &q.Avail
	}
	return &q.Used
}

func setHalf(p *uint64, off uint64, v uint32) {
	if off%8 == 0 { // the Low registers sit at multiples of 16, High at +4
		*p = *p&^0xffffffff | uint64(v)
	} else {
		*p = *p&0xffffffff | uint64(v)<<32
	}
}

func (t *MMIO) selected() *Queue {
	if int(t.queueSel) < len(t.queues) {
		return t.queues[t.queueSel]
	}
	return nil
}

// setStatus implements the device status state machine (mu held).
func (t *MMIO) setStatus(v uint32) {
	if v == 0 {
		t.reset()
		return
	}
	if v&^t.status&StatusFeaturesOK != 0 {
		// The driver may accept only what we offered, and must speak 1.x.
		if t.drvFeatures&^t.features() != 0 || t.drvFeatures&FeatureVersion1 == 0 {
			v &^= StatusFeaturesOK
		}
	}
	if v&^t.status&StatusDriverOK != 0 && !t.activated {
		t.status = v
		if err := t.activate(); err != nil {
			t.broken(err)
		}
		return
	}
	t.status = v | t.status&StatusNeedsReset
}

// RaisePending signals the interrupt line again when an interrupt is
// pending (InterruptStatus not yet acknowledged by the driver). The VMM
// calls it once a restored VM's vCPUs hold their saved LAPIC state: a
// device restored before that may have signalled into an irqchip whose
// LAPIC state was then loaded over the interrupt, and the guest would
// never hear of it.
func (t *MMIO) RaisePending() {
	t.mu.Lock()
	pending := t.intStatus != 0
	t.mu.Unlock()
	if pending {
		t.signal()
	}
}

func (t *MMIO) activate() error {
	t.waitReset()
	if t.status&StatusFeaturesOK == 0 {
		return fmt.Errorf("%w: DRIVER_OK without FEATURES_OK", ErrBroken)
	}
	a := &Activation{
		Mem:      t.mem,
		Features: t.drvFeatures,
		Queues:   t.queues,
		Interrupt: func() {
			t.mu.Lock()
			t.intStatus |= intUsedBuffer
			t.mu.Unlock()
			t.signal()
		},
		Broken: func(err error) {
			t.mu.Lock()
			defer t.mu.Unlock()
			t.broken(err)
		},
		gate: &gate{},
	}
	if t.quiesced {
		a.gate.shut()
	}
	t.gate = a.gate
	for _, q := range t.queues {
		q.EventIdx = t.drvFeatures&FeatureEventIdx != 0
		if q.Ready {
			if err := q.Validate(t.mem); err != nil {
				return err
			}
		}
	}
	for _, k := range t.kicks {
		a.Kicks = append(a.Kicks, k)
	}
	t.activated = true
	return t.dev.Activate(a)
}

// maxBrokenLogs is the most driver faults an MMIO transport logs.
const maxBrokenLogs = 8

// broken marks the device as needing a reset after a driver fault and
// tells the driver with a configuration-change interrupt (mu held).
func (t *MMIO) broken(err error) {
	if !t.brokenLogged && t.brokenLogs < maxBrokenLogs {
		t.brokenLogs++
		if t.brokenLogs == maxBrokenLogs {
			t.log.Warn("virtio device needs reset (its further faults are not logged)", "device", t.name, "err", err, "faults", t.brokenLogs)
		} else {
			t.log.Warn("virtio device needs reset", "device", t.name, "err", err)
		}
	}
	t.brokenLogged = true
	if t.status&StatusNeedsReset != 0 {
		return
	}
	t.status |= StatusNeedsReset
	if t.activated {
		// The caller may be one of the device's own workers, so the
		// device is reset on another goroutine; activate and reset wait
		// for it before the device is used again.
		done := make(chan struct{})
		t.resetting = done
		go func() { t.dev.Reset(); close(done) }()
		t.activated = false
	}
	if t.status&StatusDriverOK != 0 {
		t.intStatus |= intConfigChange
		t.signals.Add(1)
		go func() { defer t.signals.Done(); t.signal() }()
	}
}

// waitReset waits, with mu released, for a reset started by broken (mu held).
func (t *MMIO) waitReset() {
	if done := t.resetting; done != nil {
		t.mu.Unlock()
		<-done
		t.mu.Lock()
		t.resetting = nil
	}
}

func (t *MMIO) reset() {
	t.waitReset()
	if t.activated {
		t.mu.Unlock()
		t.dev.Reset()
		t.mu.Lock()
		t.activated = false
	}
	for _, q := range t.queues {
		q.Reset()
	}
	t.status, t.devFeatSel, t.drvFeatSel, t.drvFeatures, t.queueSel, t.intStatus = 0, 0, 0, 0, 0, 0
	t.brokenLogged = false
}

// ConfigChanged tells the driver the device configuration changed. It
// raises an interrupt: not to be called while the transport is quiesced.
func (t *MMIO) ConfigChanged() {
	t.mu.Lock()
	t.configGen++
	t.intStatus |= intConfigChange
	t.mu.Unlock()
	t.signal()
}

func (t *MMIO) signal() {
	if t.irq == nil {
		return
	}
	if err := t.irq.Signal(); err != nil {
		t.log.Warn("virtio interrupt failed", "device", t.name, "err", err)
	}
}

// Shutdown stops the device's workers if it is active (VM teardown).
func (t *MMIO) Shutdown() {
	t.mu.Lock()
	t.waitReset()
	active := t.activated
	t.activated = false
	t.mu.Unlock()
	if active {
		t.dev.Reset()
	}
}
