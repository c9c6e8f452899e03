// Package virtiommio is the virtio-mmio register layout (virtio 1.x,
// section 4.2.2, MMIO version 2) and the device status bits: the one
// copy read by the VMM's transport (devices/virtio), its test drivers
// (devices/virtio/virtiotest) and the hostile driver in the guest
// (guestinit/cmd/hostiledev). Constants only.
package virtiommio

// Register offsets in a device's window.
const (
	Magic             = 0x000
	Version           = 0x004
	DeviceID          = 0x008
	VendorID          = 0x00c
	DeviceFeatures    = 0x010
	DeviceFeaturesSel = 0x014
	DriverFeatures    = 0x020
	DriverFeaturesSel = 0x024
	QueueSel          = 0x030
	QueueNumMax       = 0x034
	QueueNum          = 0x038
	QueueReady        = 0x044
	QueueNotify       = 0x050
	InterruptStatus   = 0x060
	InterruptACK      = 0x064
	Status            = 0x070
	QueueDescLow      = 0x080
	QueueDescHigh     = 0x084
	QueueDriverLow    = 0x090
	QueueDriverHigh   = 0x094
	QueueDeviceLow    = 0x0a0
	QueueDeviceHigh   = 0x0a4
	ConfigGeneration  = 0x0fc
	Config            = 0x100
)

// Device status bits (the Status register).
const (
	StatusAcknowledge = 1
	StatusDriver      = 2
	StatusDriverOK    = 4
	StatusFeaturesOK  = 8
	StatusNeedsReset  = 64
	StatusFailed      = 128
)
