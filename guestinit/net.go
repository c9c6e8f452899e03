//go:build linux

package guestinit

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/guestinit/etc"
)

// Network command-line keys. Without KeyIP the guest's eth0 is left
// alone (lo is still brought up).
const (
	// KeyIP is eth0's IPv4 address and prefix length: warren.ip=10.0.2.15/24.
	KeyIP = "warren.ip"
	// KeyGW is the IPv4 default gateway, inside KeyIP's subnet:
	// warren.gw=10.0.2.2.
	KeyGW = "warren.gw"
	// KeyDNS is a comma-separated list of name servers written to
	// /etc/resolv.conf: warren.dns=10.0.2.3.
	KeyDNS = "warren.dns"
	// KeyIPv6, when true, leaves IPv6 on for eth0 (link-local
	// autoconfiguration; Warren configures no IPv6 address). By default
	// PID 1 disables IPv6 on eth0 before bringing it up: the network is
	// IPv4 only, and the router solicitations, duplicate address checks
	// and MLD reports of a link-local address would only be dropped (and
	// audited) by the host's egress filter. lo keeps ::1 either way.
	KeyIPv6 = "warren.ipv6"
)

// NetIface is the interface the network keys configure: the first
// virtio-net device.
const NetIface = "eth0"

// ResolvConfPath is where KeyDNS is written.
const ResolvConfPath = "/etc/resolv.conf"

// NetConfig is the guest network configuration from the command line. A
// zero Addr means eth0 is not configured; a zero Gateway, no default route;
// no DNS, no resolv.conf.
type NetConfig struct {
	Addr    netip.Prefix // the address with its prefix length
	Gateway netip.Addr
	DNS     []netip.Addr
	// IPv6 keeps IPv6 on for the interface (KeyIPv6).
	IPv6 bool
}

// NetConfigFromCmdline reads the network keys. It returns what is valid
// together with an error describing each invalid key, so that a mistake in
// one key does not cost the others. An empty value counts as absent.
func NetConfigFromCmdline(c Cmdline) (NetConfig, error) {
	n := NetConfig{IPv6: c.Bool(KeyIPv6)}
	var errs []error
	if v := c.Get(KeyIP, ""); v != "" {
		p, err := netip.ParsePrefix(v)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s=%q: %w", KeyIP, v, err))
		case !p.Addr().Is4():
			errs = append(errs, fmt.Errorf("%s=%q: not an IPv4 address", KeyIP, v))
		case p.Bits() == 0:
			errs = append(errs, fmt.Errorf("%s=%q: prefix length 0", KeyIP, v))
		default:
			n.Addr = p
		}
	}
	if v := c.Get(KeyGW, ""); v != "" {
		gw, err := netip.ParseAddr(v)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s=%q: %w", KeyGW, v, err))
		case !n.Addr.IsValid():
			errs = append(errs, fmt.Errorf("%s=%q: needs a valid %s", KeyGW, v, KeyIP))
		case !gw.Is4() || !n.Addr.Masked().Contains(gw) || gw == n.Addr.Addr():
			errs = append(errs, fmt.Errorf("%s=%q: not another IPv4 address in %s", KeyGW, v, n.Addr.Masked()))
		default:
			n.Gateway = gw
		}
	}
	if v := c.Get(KeyDNS, ""); v != "" {
		for _, s := range strings.Split(v, ",") {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				errs = append(errs, fmt.Errorf("%s=%q: bad name server %q", KeyDNS, v, s))
				continue
			}
			n.DNS = append(n.DNS, a)
		}
	}
	return n, errors.Join(errs...)
}

// ResolvConf is the resolv.conf text for the given name servers.
func ResolvConf(dns []netip.Addr) string {
	var b strings.Builder
	for _, a := range dns {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	return b.String()
}

// configureNetwork applies the network keys of c, reporting failures on the
// console (one line) and never stopping the boot.
func configureNetwork(c Cmdline) {
	n, err := NetConfigFromCmdline(c)
	if err = errors.Join(err, n.Apply(NetIface, ResolvConfPath)); err != nil {
		report(fmt.Errorf("network: %w", err))
	}
}

// Apply brings lo up and, when n has an address, configures ifname: the
// address and netmask, up, and the default route; it writes resolvPath
// when n has name servers. It goes on after a failure and returns them all.
// It uses the classic ioctls (what ifconfig and route do): a handful of
// system calls, no netlink library.
func (n NetConfig) Apply(ifname, resolvPath string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	var errs []error
	if err := setUp(fd, "lo"); err != nil {
		errs = append(errs, err)
	}
	if n.Addr.IsValid() {
		if err := configureIface(fd, ifname, n); err != nil {
			errs = append(errs, err)
		}
	}
	if len(n.DNS) > 0 {
		// Replaced atomically, and a symlink in its place (an image's
		// systemd-resolved stub, say, dangling now that /run is empty)
		// is replaced, not followed.
		if err := os.MkdirAll(filepath.Dir(resolvPath), 0o755); err != nil {
			errs = append(errs, err)
		} else if err := etc.WriteFile(resolvPath, []byte(ResolvConf(n.DNS)), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func configureIface(fd int, ifname string, n NetConfig) error {
	mask := netmask(n.Addr.Bits())
	for _, s := range []struct {
		req  uint
		name string
		addr netip.Addr
	}{{unix.SIOCSIFADDR, "address", n.Addr.Addr()}, {unix.SIOCSIFNETMASK, "netmask", mask}} {
		ifr, err := unix.NewIfreq(ifname)
		if err != nil {
			return fmt.Errorf("%s: %w", ifname, err)
		}
		a := s.addr.As4()
		if err := ifr.SetInet4Addr(a[:]); err != nil {
			return fmt.Errorf("%s: %w", ifname, err)
		}
		if err := unix.IoctlIfreq(fd, s.req, ifr); err != nil {
			return fmt.Errorf("%s: set %s %s: %w", ifname, s.name, s.addr, err)
		}
	}
	if !n.IPv6 {
		if err := disableIPv6(ifname); err != nil {
			return err
		}
	}
	if err := setUp(fd, ifname); err != nil {
		return err
	}
	if n.Gateway.IsValid() {
		if err := addDefaultRoute(fd, ifname, n.Gateway); err != nil {
			return err
		}
	}
	return nil
}

// disableIPv6 turns IPv6 off on ifname (its disable_ipv6 sysctl); a
// kernel without IPv6 has nothing to turn off.
func disableIPv6(ifname string) error {
	p := filepath.Join("/proc/sys/net/ipv6/conf", ifname, "disable_ipv6")
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: disable IPv6: %w", ifname, err)
	}
	_, err = f.WriteString("1\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: disable IPv6: %w", ifname, err)
	}
	return nil
}

// netmask is the IPv4 netmask of a prefix length (0-32).
func netmask(bits int) netip.Addr {
	m := ^uint32(0) << (32 - bits)
	return netip.AddrFrom4([4]byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)})
}

// setUp sets IFF_UP on ifname.
func setUp(fd int, ifname string) error {
	ifr, err := unix.NewIfreq(ifname)
	if err != nil {
		return fmt.Errorf("%s: %w", ifname, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("%s: get flags: %w", ifname, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("%s: set up: %w", ifname, err)
	}
	return nil
}

// rtentry is the kernel's struct rtentry (SIOCADDRT). Its layout follows
// the C struct on every Linux ABI: unsigned long and pointers are uintptr
// sized, and Go aligns fields as C does.
type rtentry struct {
	pad1    uintptr
	dst     unix.RawSockaddrInet4
	gateway unix.RawSockaddrInet4
	genmask unix.RawSockaddrInet4
	flags   uint16
	pad2    int16
	pad3    uintptr
	pad4    uintptr
	metric  int16
	dev     *byte
	mtu     uintptr
	window  uintptr
	irtt    uint16
}

// addDefaultRoute adds 0.0.0.0/0 via gw on ifname (an existing one is fine).
func addDefaultRoute(fd int, ifname string, gw netip.Addr) error {
	dev, err := unix.BytePtrFromString(ifname)
	if err != nil {
		return fmt.Errorf("%s: %w", ifname, err)
	}
	rt := rtentry{flags: unix.RTF_UP | unix.RTF_GATEWAY, dev: dev}
	rt.dst.Family, rt.gateway.Family, rt.genmask.Family = unix.AF_INET, unix.AF_INET, unix.AF_INET
	rt.gateway.Addr = gw.As4()
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCADDRT, uintptr(unsafe.Pointer(&rt)))
	if errno != 0 && errno != unix.EEXIST {
		return fmt.Errorf("%s: default route via %s: %w", ifname, gw, errno)
	}
	return nil
}
