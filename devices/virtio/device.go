package virtio

import "github.com/warrenvm/warren/internal/virtiommio"

// Virtio device IDs.
const (
	TypeNet   = 1
	TypeBlock = 2
	TypeRNG   = 4
	TypeVsock = 19
)

// Feature bits common to all devices.
const (
	FeatureIndirectDesc = 1 << 28
	FeatureEventIdx     = 1 << 29
	FeatureVersion1     = 1 << 32
)

// Device status bits (virtiommio's, under this package's names).
const (
	StatusAcknowledge = virtiommio.StatusAcknowledge
	StatusDriver      = virtiommio.StatusDriver
	StatusDriverOK    = virtiommio.StatusDriverOK
	StatusFeaturesOK  = virtiommio.StatusFeaturesOK
	StatusNeedsReset  = virtiommio.StatusNeedsReset
	StatusFailed      = virtiommio.StatusFailed
)

// Device is a virtio device model behind a transport.
//
// The transport calls Features, QueueSizes and the config accessors from
// vCPU threads; Activate once the driver sets DRIVER_OK; Reset when the
// driver resets the device (or it must be reset), after which the device
// must have stopped touching its queues and guest memory.
//
// The device's goroutines touch guest memory, the queues and the interrupt
// only inside service passes (Activation.Enter to Leave), and push every
// chain they pop before the pass ends, so that the transport can quiesce
// the device for a snapshot (MMIO.Quiesce); host-side I/O into the device's
// own buffers happens outside passes. A pass should end early, at a safe
// point, when Activation.Quiescing reports true.
type Device interface {
	// Type is the virtio device ID.
	Type() uint32
	// Features are the feature bits offered (FeatureVersion1 is added by the
	// transport).
	Features() uint64
	// QueueSizes gives the maximum size of each queue.
	QueueSizes() []uint16
	// ReadConfig and WriteConfig access device-specific configuration space.
	ReadConfig(off uint64, data []byte)
	WriteConfig(off uint64, data []byte)
	// Activate hands the device its queues. It must return quickly; work
	// happens on the device's own goroutines.
	Activate(a *Activation) error
	// Reset stops the device's goroutines and forgets its queues.
	Reset()
}

// Activation is what a device gets when the driver is ready.
//
// Its workers use Mem, Queues, Interrupt and Broken only inside service
// passes (Enter ... Leave), so that the transport can quiesce the device
// for a snapshot; see MMIO.Quiesce.
type Activation struct {
	Mem      Memory
	Features uint64   // negotiated
	Queues   []*Queue // configured and validated; owned by the device until Reset
	// Kicks[i] receives a value whenever the driver notifies queue i.
	Kicks []<-chan struct{}
	// Interrupt tells the driver that used buffers are ready.
	Interrupt func()
	// Broken reports a driver fault found by the device (ErrBroken): the
	// transport sets NEEDS_RESET and stops the device.
	Broken func(error)

	// gate holds the device's service passes (Enter, Leave) while the
	// transport is quiesced; nil in an Activation built by hand.
	gate *gate
}
