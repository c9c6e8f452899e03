package vmm

import (
	"github.com/warrenvm/warren/vmm/serial"
)

// uartPorts adapts a serial.UART to the port bus.
type uartPorts struct{ u *serial.UART }

func (p uartPorts) Read(off uint64, data []byte) {
	for i := range data {
		data[i] = p.u.Read(uint8(off + uint64(i)))
	}
}

func (p uartPorts) Write(off uint64, data []byte) {
	for i, v := range data {
		p.u.Write(uint8(off+uint64(i)), v)
	}
}

// i8042 is the PC keyboard controller, reduced to what a guest uses to reset
// the machine: command 0xFE on port 0x64 pulses the CPU reset line. Warren
// treats that as the guest powering off (there is no ACPI; Linux reboots
// through it with reboot=k). Offsets: 0 is port 0x60, 4 is port 0x64.
type i8042 struct {
	reset func()
}

const (
	i8042DataPort    = 0x60
	i8042CommandPort = 0x64
	i8042CmdReset    = 0xfe
)

func (k i8042) Read(off uint64, data []byte) {
	for i := range data {
		data[i] = 0 // no data, input buffer empty, ready for commands
	}
}

func (k i8042) Write(off uint64, data []byte) {
	if off == i8042CommandPort-i8042DataPort && len(data) > 0 && data[0] == i8042CmdReset {
		k.reset()
	}
}

// sink accepts and ignores accesses, reading as zero (e.g. the POST port).
type sink struct{}

func (sink) Read(off uint64, data []byte) { clear(data) }
func (sink) Write(uint64, []byte)         {}
