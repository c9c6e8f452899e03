package vmmproc

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/vmmproc/credproxy"
	"github.com/warrenvm/warren/vmmproc/egress"
)

// From a parsed command line to what Run and Restore run: the files and
// values the flags name, read and checked, so that a mistake fails
// before any VM exists.

// Spec is what Run boots for `warren run`'s command line a: the kernel
// and initramfs read (from paths or inherited descriptors), the console
// opened (closeOut closes it, after Run), the jail, MAC and network
// options checked, the guest's network added to its command line; the
// log goes to stderr.
func (a RunArgs) Spec(stdout, stderr io.Writer) (s Spec, closeOut func(), err error) {
	if a.Kernel == "" && a.KernelFD == 0 {
		return s, nil, errors.New("--kernel or --kernel-fd is required")
	}
	js, err := ParseJail(a.Jail)
	if err != nil {
		return s, nil, err
	}
	if a.MemMiB <= 0 {
		return s, nil, fmt.Errorf("--mem must be a positive number of MiB, got %d", a.MemMiB)
	}
	k, err := readBootFile("kernel", a.Kernel, fdOrNone(a.KernelFD))
	if err != nil {
		return s, nil, err
	}
	rd, err := readBootFile("initramfs", a.Initramfs, fdOrNone(a.InitramfsFD))
	if err != nil {
		return s, nil, err
	}
	mac, err := ParseMAC(a.MAC)
	if err != nil {
		return s, nil, err
	}
	if a.MAC != "" && a.Tap == "" {
		return s, nil, errors.New("--mac needs --tap")
	}
	eg, netCmdline, err := netOptions(a)
	if err != nil {
		return s, nil, err
	}
	cmdline := a.Cmdline
	if netCmdline != "" {
		cmdline = strings.TrimSpace(netCmdline + " " + cmdline)
	}
	out, closeOut, err := OpenConsole(a.Console, stdout)
	if err != nil {
		return s, nil, err
	}
	return Spec{
		MemMiB: a.MemMiB, CPUs: a.CPUs, Kernel: k, Initramfs: rd, Cmdline: cmdline, Egress: eg,
		Console: out, KVMPath: a.KVMPath, Log: NewLogger(stderr, a.Verbose), RNG: !a.NoRNG, Balloon: a.Balloon,
		Disks: a.Disks, Tap: a.Tap, MAC: mac, Vsock: a.Vsock, CID: a.CID,
		API: a.API, PrivateNet: a.PrivateNet, Jail: js,
	}, closeOut, nil
}

// Spec is what Restore runs for `warren restore`'s command line a, the
// console to stdout unless a names a file, the log to stderr; a jail
// that does not parse is a *UsageError.
func (a RestoreArgs) Spec(stdout, stderr io.Writer) (RestoreSpec, error) {
	js, err := ParseJail(a.Jail)
	if err != nil {
		return RestoreSpec{}, &UsageError{err}
	}
	return RestoreSpec{
		Snapshot: a.Snapshot, Memory: a.Mode(), RecordWorkingSet: a.RecordWorkingSet, Prefetch: a.Prefetch,
		API: a.API, Vsock: a.Vsock,
		ConsoleFile: a.Console, Stdout: stdout, KVMPath: a.KVMPath, Log: NewLogger(stderr, a.Verbose),
		Timing: a.Timing, Egress: EgressOverrides{Policy: a.Egress, Secrets: a.Secrets, Audit: a.Audit},
		DiskPaths: DiskPaths(a.DiskPaths), Jail: js,
	}, nil
}

// netOptions turns a's network flags into egress options (nil without
// --egress) and the kernel command-line arguments that configure the
// guest's network.
func netOptions(a RunArgs) (*EgressOptions, string, error) {
	var cmdline string
	var host netip.Prefix
	var guest netip.Addr
	var err error
	if a.HostIP != "" {
		if a.Tap == "" {
			return nil, "", errors.New("--host-ip needs --tap")
		}
		if host, err = netip.ParsePrefix(a.HostIP); err != nil || !host.Addr().Is4() {
			return nil, "", fmt.Errorf("--host-ip %q: want an IPv4 address with a prefix length", a.HostIP)
		}
	}
	if a.GuestIP != "" {
		if !host.IsValid() {
			return nil, "", errors.New("--guest-ip needs --host-ip")
		}
		if guest, err = netip.ParseAddr(a.GuestIP); err != nil || !host.Contains(guest) || guest == host.Addr() {
			return nil, "", fmt.Errorf("--guest-ip %q: want another address in %v", a.GuestIP, host.Masked())
		}
		cmdline = fmt.Sprintf("warren.ip=%v/%d warren.gw=%v warren.dns=%v", guest, host.Bits(), host.Addr(), host.Addr())
	}
	if a.Egress == "" {
		for _, s := range []string{a.Audit, a.Secrets, a.Hosts, a.DNSUpstream, a.UpstreamCA} {
			if s != "" {
				return nil, "", errors.New("--audit, --secrets, --hosts, --dns-upstream and --upstream-ca need --egress")
			}
		}
		return nil, cmdline, nil
	}
	if !host.IsValid() {
		return nil, "", errors.New("--egress needs --tap and --host-ip")
	}
	allow, err := policy.ParsePrefixes(a.UpstreamAllow)
	if err != nil {
		return nil, "", fmt.Errorf("--upstream-allow: %w", err)
	}
	p, err := policy.LoadWith(a.Egress, policy.Options{WildcardCredentials: a.WildcardCredentials})
	if err != nil {
		return nil, "", err
	}
	e := &EgressOptions{HostAddr: host, GuestAddr: guest, Audit: a.Audit, DNSUpstream: a.DNSUpstream,
		Attach: a.EgressAttach, Sandbox: a.Tap, State: egress.State{Policy: p}, UpstreamAllow: allow, WildcardCredentials: a.WildcardCredentials}
	if e.Audit == "" {
		e.Audit = "warren-egress-" + a.Tap + ".jsonl"
	}
	for _, p := range []struct {
		in  string
		out *string
	}{{e.Audit, &e.Audit}, {a.Secrets, &e.Secrets}, {a.Hosts, &e.Hosts}, {a.UpstreamCA, &e.UpstreamCA}} {
		if p.in != "" {
			if *p.out, err = filepath.Abs(p.in); err != nil {
				return nil, "", err
			}
		}
	}
	if _, err := ParseAttach(e.Attach); err != nil {
		return nil, "", err
	}
	// Read what can be checked now, so that a mistake fails before the VM.
	if e.Secrets != "" {
		if err := (credproxy.FileStore{Path: e.Secrets}).Check(); err != nil {
			return nil, "", err
		}
	}
	if e.Hosts != "" {
		if _, err := egress.ReadHosts(e.Hosts); err != nil {
			return nil, "", err
		}
	}
	return e, cmdline, nil
}

// fdOrNone is readBootFile's descriptor for a RunArgs one (0: none).
func fdOrNone(fd int) int {
	if fd == 0 {
		return -1
	}
	return fd
}

// readBootFile reads a kernel or initramfs (what) from the file at path
// or, when fd is not negative, from the inherited descriptor fd (a
// regular file, closed once read: a forked child of the VMM must not
// inherit it); neither gives nil. Both at once is an error.
func readBootFile(what, path string, fd int) ([]byte, error) {
	switch {
	case fd < 0 && path == "":
		return nil, nil
	case fd < 0:
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", what, err)
		}
		return b, nil
	case path != "":
		return nil, fmt.Errorf("--%s and --%s-fd: give one", what, what)
	case fd < 3:
		return nil, fmt.Errorf("--%s-fd %d: not an inherited descriptor (3 or more)", what, fd)
	}
	f := os.NewFile(uintptr(fd), what)
	if f == nil {
		return nil, fmt.Errorf("--%s-fd %d: not open", what, fd)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("--%s-fd %d: %w", what, fd, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("--%s-fd %d: not a regular file (%s)", what, fd, fi.Mode().Type())
	}
	if fi.Size() > maxBootFile {
		return nil, fmt.Errorf("--%s-fd %d: %d bytes, more than %d", what, fd, fi.Size(), maxBootFile)
	}
	// ReadAt from 0: the descriptor's offset is shared with the daemon's.
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && fi.Size() == 0) {
		return nil, fmt.Errorf("read %s from descriptor %d: %w", what, fd, err)
	}
	return b, nil
}

// maxBootFile bounds a kernel or initramfs read from a descriptor.
const maxBootFile = 1 << 30
