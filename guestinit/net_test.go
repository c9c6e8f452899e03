//go:build linux

package guestinit

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/internal/nsenter"
)

func TestNetConfigFromCmdline(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		want    string // fmt of the config
		errs    []string
	}{
		{"console=ttyS0", "{invalid Prefix invalid IP [] false}", nil},
		{"warren.ip=10.0.2.15/24 warren.gw=10.0.2.2 warren.dns=10.0.2.3",
			"{10.0.2.15/24 10.0.2.2 [10.0.2.3] false}", nil},
		{"warren.ip=10.0.2.15/24 warren.dns=10.0.2.3,1.1.1.1,fd00::1",
			"{10.0.2.15/24 invalid IP [10.0.2.3 1.1.1.1 fd00::1] false}", nil},
		{"warren.ip= warren.gw= warren.dns=", "{invalid Prefix invalid IP [] false}", nil},
		{"warren.ip=10.0.2.15 warren.gw=10.0.2.2", "{invalid Prefix invalid IP [] false}",
			[]string{`warren.ip="10.0.2.15"`, `warren.gw="10.0.2.2": needs a valid warren.ip`}},
		{"warren.ip=fd00::2/64", "{invalid Prefix invalid IP [] false}", []string{"not an IPv4 address"}},
		{"warren.ip=10.0.2.15/0", "{invalid Prefix invalid IP [] false}", []string{"prefix length 0"}},
		{"warren.ip=10.0.2.15/24 warren.gw=10.0.3.1", "{10.0.2.15/24 invalid IP [] false}", []string{"not another IPv4 address in 10.0.2.0/24"}},
		{"warren.ip=10.0.2.15/24 warren.gw=10.0.2.15", "{10.0.2.15/24 invalid IP [] false}", []string{"not another"}},
		{"warren.ip=10.0.2.15/32 warren.gw=10.0.2.2", "{10.0.2.15/32 invalid IP [] false}", []string{"not another"}},
		{"warren.ip=10.0.2.15/24 warren.dns=10.0.2.3,,x", "{10.0.2.15/24 invalid IP [10.0.2.3] false}",
			[]string{`bad name server ""`, `bad name server "x"`}},
		{"warren.dns=fe80::1%eth0", "{invalid Prefix invalid IP [] false}", []string{"bad name server"}},
		{`"warren.ip=10.0.2.15/24" warren.ip=192.168.0.2/16`, "{192.168.0.2/16 invalid IP [] false}", nil},
		{"warren.ip=10.0.2.15/24 warren.ipv6=1", "{10.0.2.15/24 invalid IP [] true}", nil},
	} {
		n, err := NetConfigFromCmdline(ParseCmdline(tc.cmdline))
		if got := fmt.Sprint(n); got != tc.want {
			t.Errorf("%q: config %s, want %s", tc.cmdline, got, tc.want)
		}
		if (err != nil) != (len(tc.errs) > 0) {
			t.Errorf("%q: err %v, want %q", tc.cmdline, err, tc.errs)
			continue
		}
		for _, e := range tc.errs {
			if !strings.Contains(err.Error(), e) {
				t.Errorf("%q: err %q lacks %q", tc.cmdline, err, e)
			}
		}
		if err != nil && strings.Count(ErrorLine(err), "\n") != 1 {
			t.Errorf("%q: error is not one console line", tc.cmdline)
		}
	}
}

func TestResolvConf(t *testing.T) {
	got := ResolvConf([]netip.Addr{netip.MustParseAddr("10.0.2.3"), netip.MustParseAddr("fd00::53")})
	if want := "nameserver 10.0.2.3\nnameserver fd00::53\n"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	for bits, want := range map[int]string{1: "128.0.0.0", 24: "255.255.255.0", 32: "255.255.255.255"} {
		if got := netmask(bits).String(); got != want {
			t.Errorf("netmask(%d) = %s", bits, got)
		}
	}
}

// TestApply configures an eth0 in a network namespace of its own
// (10.200.1.0/24 only) with the same code PID 1 runs.
func TestApply(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (ip netns, interface ioctls)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	ipc := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	ns := fmt.Sprintf("wginit%d", os.Getpid())
	ipc("netns", "add", ns)
	defer exec.Command("ip", "netns", "del", ns).Run()
	// A persistent tap stands in for virtio-net's eth0 (dummy interfaces
	// need a module that is often missing).
	if out, err := exec.Command("ip", "-n", ns, "tuntap", "add", "dev", "eth0", "mode", "tap").CombinedOutput(); err != nil {
		t.Skipf("cannot make a tap for eth0: %v: %s", err, out)
	}
	n, err := NetConfigFromCmdline(ParseCmdline("warren.ip=10.200.1.15/24 warren.gw=10.200.1.2 warren.dns=10.200.1.3"))
	if err != nil {
		t.Fatal(err)
	}
	resolv := filepath.Join(t.TempDir(), "etc", "resolv.conf")
	if err := nsenter.Net(ns, func() error { return n.Apply("eth0", resolv) }); err != nil {
		t.Fatal(err)
	}
	if out := ipc("-n", ns, "-o", "-4", "addr", "show", "eth0"); !strings.Contains(out, "inet 10.200.1.15/24 brd 10.200.1.255") {
		t.Errorf("eth0 address: %s", out)
	}
	if out := ipc("-n", ns, "-o", "link", "show", "lo"); !strings.Contains(out, ",UP") {
		t.Errorf("lo not up: %s", out)
	}
	if out := ipc("-n", ns, "route", "show", "default"); !strings.Contains(out, "default via 10.200.1.2 dev eth0") {
		t.Errorf("default route: %q", out)
	}
	if b, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv6/conf/eth0/disable_ipv6").Output(); err == nil && string(b) != "1\n" {
		t.Errorf("IPv6 on eth0: disable_ipv6 is %q", b)
	}
	if b, err := os.ReadFile(resolv); err != nil || string(b) != "nameserver 10.200.1.3\n" {
		t.Errorf("resolv.conf %q, %v", b, err)
	}
	// Missing interface: one error, the rest still done.
	err = nsenter.Net(ns, func() error {
		return NetConfig{Addr: netip.MustParsePrefix("10.200.1.15/24")}.Apply("nosuch0", resolv)
	})
	if err == nil || !strings.Contains(err.Error(), "nosuch0") {
		t.Errorf("missing interface: %v", err)
	}
}
