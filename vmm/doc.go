// Package vmm runs a microVM on KVM: guest RAM in a memfd, one OS thread per
// vCPU, KVM's in-kernel irqchip (PIC, IOAPIC, LAPICs) and PIT, a 16550A
// UART on COM1 for the console, and an i8042 whose reset line ends the VM.
//
// Threads: New, Restore and Close run on the caller's goroutine. Run starts
// one goroutine per vCPU, each locked to its own OS thread for its whole
// life; only that thread touches its kvm.VCPU (creating it, loading a saved
// state into it, running it, reading its state for SaveState). Devices are
// called from whichever vCPU thread exits to them. Stop may be called from
// any goroutine: it marks the VM stopping and kicks every vCPU out of
// KVM_RUN with immediate_exit and a signal. Pause and Resume may be called
// from any goroutine too: Pause kicks the vCPUs the same way and each
// thread parks itself between two KVM_RUNs; while parked it runs the reads
// SaveState hands it (the handshake is described in pause.go).
//
// Snapshots: Pause, SaveState and a copy of Memory() capture a VM; Restore
// builds a new VM from them, and Run resumes the guest where it was.
//
// Guest memory is owned by the VM (see guestmem); the boot loader writes it
// before any vCPU runs, devices afterwards through bounds-checked accessors.
//
// May import: vmm/kvm, devices (same rank), internal. Not cow, memsnap,
// ebpf, image, hostd, cmd, bench or guest code (internal/layout checks
// it); vmm/kvm imports nothing of the module.
package vmm
