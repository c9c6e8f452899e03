//go:build linux

package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/guestinit/etc"
)

// MachineIDPath is where ApplyIdentity writes the machine id.
var MachineIDPath = "/etc/machine-id"

// HostnameEtcDir is the directory whose hostname and hosts files
// ApplyIdentity keeps in step with the hostname (etc.WriteHostname), when
// they exist: PID 1 makes them in an image root, the initramfs has none.
// "" leaves them alone (PID 1 sets it for a read-only root).
var HostnameEtcDir = "/etc"

// ApplyIdentity makes the guest take on id: the machine id (written to
// MachineIDPath, replaced atomically), the MAC address of the first
// Ethernet interface (SIOCSIFHWADDR; virtio-net allows a live change) and,
// last, the hostname (sethostname, and HostnameEtcDir's hostname file and
// 127.0.1.1 hosts line where they exist), so that the new hostname means
// the whole identity is in place. Fields that are empty are left
// alone. It needs CAP_SYS_ADMIN and CAP_NET_ADMIN (PID 1 has them).
func ApplyIdentity(id *agentwire.Identity) error {
	if id == nil {
		return nil
	}
	if err := id.Check(); err != nil {
		return err
	}
	var errs []error
	if id.MachineID != "" {
		err := os.MkdirAll(filepath.Dir(MachineIDPath), 0o755)
		if err == nil {
			err = etc.WriteFile(MachineIDPath, []byte(id.MachineID+"\n"), 0o444)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("identity: machine id: %w", err))
		}
	}
	if id.MAC != "" {
		if err := setMAC(id.MAC); err != nil {
			errs = append(errs, fmt.Errorf("identity: MAC: %w", err))
		}
	}
	// The hostname last: a reader that sees the new hostname (the health
	// answer reads it first) sees the rest of the identity too. CI once
	// saw a fork child's new hostname with no machine id yet.
	if id.Hostname != "" {
		if err := unix.Sethostname([]byte(id.Hostname)); err != nil {
			errs = append(errs, fmt.Errorf("identity: sethostname: %w", err))
		}
		if HostnameEtcDir != "" {
			if err := etc.WriteHostname(HostnameEtcDir, id.Hostname, false); err != nil {
				errs = append(errs, fmt.Errorf("identity: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// setMAC sets mac on the first interface that has a 6-byte hardware
// address and is not loopback.
func setMAC(mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return err
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || len(ifc.HardwareAddr) != 6 {
			continue
		}
		if ifc.HardwareAddr.String() == hw.String() {
			return nil
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// struct ifreq { char ifr_name[16]; struct sockaddr ifr_hwaddr; ... }
		var req struct {
			name   [unix.IFNAMSIZ]byte
			family uint16
			data   [14]byte
			_      [8]byte
		}
		copy(req.name[:], ifc.Name)
		req.family = unix.ARPHRD_ETHER
		copy(req.data[:], hw)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCSIFHWADDR, uintptr(unsafe.Pointer(&req))); e != 0 {
			return fmt.Errorf("SIOCSIFHWADDR %s: %w", ifc.Name, e)
		}
		return nil
	}
	return fmt.Errorf("no Ethernet interface")
}
