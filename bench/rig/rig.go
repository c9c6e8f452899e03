// Package rig is what the VM benchmarks share about the machine they run
// on: the files they start (the guest kernel and initramfs, the warren
// binary, the QEMU peer), the flags that name them, and the check, before
// anything starts, that the host has what a run needs; and how they start
// their guests: warren's command line, the wait for a guest's agent, a
// VMM in a process group of its own.
package rig

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
)

// Files are the files a VM benchmark starts.
type Files struct {
	Kernel, Initramfs, Warren, QEMU string
}

// Flags registers --kernel, --initramfs, --warren and --qemu on the
// command line (flag.CommandLine) with the build's outputs as defaults;
// initramfs describes the initramfs the benchmark needs.
func (f *Files) Flags(initramfs string) {
	flag.StringVar(&f.Kernel, "kernel", "build/vmlinux", "guest kernel (vmlinux with PVH note)")
	flag.StringVar(&f.Initramfs, "initramfs", "build/initramfs.cpio", initramfs)
	flag.StringVar(&f.Warren, "warren", "bin/warren", "warren binary")
	flag.StringVar(&f.QEMU, "qemu", "qemu-system-x86_64", "QEMU binary (the peer)")
}

// Needs is what a benchmark needs of the host besides /dev/kvm.
type Needs struct {
	// Root says what root is needed for; empty: it is not.
	Root string
	// Files: the kernel, initramfs and warren binary exist.
	Files bool
	// QEMU: the QEMU binary is installed; VhostVsock: so is
	// /dev/vhost-vsock (the QEMU guest's vsock device).
	QEMU, VhostVsock bool
	// Otherwise is added to a QEMU error: how to run without the peer.
	Otherwise string
}

// Check fails early, saying what to do, when the host lacks what a run
// needs: /dev/kvm, and what n names.
func (f Files) Check(n Needs) error {
	if n.Root != "" && os.Geteuid() != 0 {
		return fmt.Errorf("needs root (%s)", n.Root)
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return errors.New("/dev/kvm is absent: run `make bench`, which runs this inside the nested KVM host")
	}
	if n.VhostVsock {
		if _, err := os.Stat("/dev/vhost-vsock"); err != nil {
			return errors.New("/dev/vhost-vsock is absent: modprobe vhost_vsock (QEMU's vsock device needs it)" + n.Otherwise)
		}
	}
	if n.QEMU {
		if _, err := exec.LookPath(f.QEMU); err != nil {
			return fmt.Errorf("%s not found: install the peer with `apt-get install qemu-system-x86`%s", f.QEMU, n.Otherwise)
		}
	}
	if n.Files {
		for _, p := range []string{f.Kernel, f.Initramfs, f.Warren} {
			if _, err := os.Stat(p); err != nil {
				return err
			}
		}
	}
	return nil
}
