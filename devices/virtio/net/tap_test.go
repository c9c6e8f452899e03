package vnet

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/internal/netframe"
	"github.com/warrenvm/warren/internal/nsenter"
)

// The tap tests run a real tap in a network namespace of their own; all
// traffic stays on 10.200.0.0/24 inside it. The "host" end is the tap's
// kernel side at hostIP, the "guest" is the device at guestIP.
var (
	hostIP  = net.IPv4(10, 200, 0, 1).To4()
	guestIP = net.IPv4(10, 200, 0, 2).To4()
)

const tapName = "wtap0"

// needTap skips the test unless real taps and namespaces can be made.
func needTap(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("tap tests need root (CAP_NET_ADMIN for /dev/net/tun and ip netns)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("tap tests need /dev/net/tun: %v", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("tap tests need iproute2's ip")
	}
}

func ip(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newNetns makes a network namespace removed at the end of the test.
func newNetns(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("wvnet%d-%d", os.Getpid(), time.Now().UnixNano()%100000)
	ip(t, "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	return ns
}

// inNetns runs fn in namespace ns (nsenter.Net), failing t on its error.
// Descriptors fn opens (taps, sockets) stay in ns.
func inNetns(t *testing.T, ns string, fn func() error) {
	t.Helper()
	if err := nsenter.Net(ns, fn); err != nil {
		t.Fatal(err)
	}
}

// tapRig is a device on a real tap in its own namespace, the tap up with
// hostIP, and a permanent neighbour entry for the guest so that the
// kernel sends to guestIP without ARP.
type tapRig struct {
	*rig
	ns      string
	tap     *countingFile
	hostMAC net.HardwareAddr
}

func newTapRig(t *testing.T) *tapRig {
	needTap(t)
	ns := newNetns(t)
	var tap *os.File
	inNetns(t, ns, func() error {
		// No IPv6 autoconfiguration chatter on the new tap.
		os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0)
		var err error
		tap, err = OpenTap(tapName)
		return err
	})
	ct := &countingFile{File: tap}
	r := newRig(t, ct, featMrg)
	ip(t, "-n", ns, "addr", "add", hostIP.String()+"/24", "dev", tapName)
	ip(t, "-n", ns, "link", "set", tapName, "up")
	ip(t, "-n", ns, "neigh", "replace", guestIP.String(), "lladdr", guestMAC.String(), "dev", tapName, "nud", "permanent")
	// Frames sent before the link is running are dropped (the noop qdisc
	// stays until link watch activates the device, up to a second): wait
	// for carrier and a real qdisc rather than sleeping. A tap's operstate
	// is UNKNOWN, not UP.
	deadline := time.Now().Add(10 * time.Second)
	for !linkRunning(ip(t, "-n", ns, "-o", "link", "show", tapName)) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not operationally up: %s", tapName, ip(t, "-n", ns, "-o", "link", "show", tapName))
		}
		time.Sleep(5 * time.Millisecond)
	}
	tr := &tapRig{rig: r, ns: ns, tap: ct}
	inNetns(t, ns, func() error {
		ifc, err := net.InterfaceByName(tapName)
		if err == nil {
			tr.hostMAC = ifc.HardwareAddr
		}
		return err
	})
	return tr
}

// linkRunning reads `ip -o link show` output: administratively up, with
// carrier, and past the noop qdisc.
func linkRunning(out string) bool {
	flags, _, _ := strings.Cut(out, ">")
	return strings.Contains(flags+",", ",UP,") && strings.Contains(flags, "LOWER_UP") &&
		!strings.Contains(out, "qdisc noop") && !strings.Contains(out, "state DOWN")
}

// udpSocket opens a UDP socket bound to hostIP:port inside the namespace.
func (r *tapRig) udpSocket(t *testing.T, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	inNetns(t, r.ns, func() error {
		var err error
		c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: hostIP, Port: port})
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestTapGuestToHost(t *testing.T) {
	r := newTapRig(t)
	sock := r.udpSocket(t, 5555)
	payload := []byte("hello from the guest")
	f := netframe.AppendUDP(nil, netframe.UDPFlow{SrcMAC: guestMAC, DstMAC: r.hostMAC,
		Src: netip.AddrFrom4([4]byte(guestIP)), Dst: netip.AddrFrom4([4]byte(hostIP)), SrcPort: 6666, DstPort: 5555}, 0, payload)
	hdr := make([]byte, HeaderLen)
	r.tx.Offer(vt.Buf{Data: hdr}, vt.Buf{Data: f})
	r.tr.Notify(txQueue)
	sock.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := sock.ReadFromUDP(buf)
	if err != nil {
		t.Fatalf("host socket: %v (device tx packets %d, errors %d)", err, r.dev.Metrics.TxPackets.Load(), r.dev.Metrics.TxErrors.Load())
	}
	if !bytes.Equal(buf[:n], payload) || !from.IP.Equal(guestIP) || from.Port != 6666 {
		t.Fatalf("host got %q from %v", buf[:n], from)
	}
	waitUsed(t, r.tx, 1)
}

func TestTapHostToGuest(t *testing.T) {
	r := newTapRig(t)
	sock := r.udpSocket(t, 5556)
	var addrs []uint64
	for range 8 {
		_, a := r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
		addrs = append(addrs, a[0])
	}
	r.tr.Notify(rxQueue)
	payload := []byte("hello from the host")
	if _, err := sock.WriteToUDP(payload, &net.UDPAddr{IP: guestIP, Port: 6667}); err != nil {
		t.Fatal(err)
	}
	// Find the UDP frame among whatever else the kernel sent.
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; ; {
		for _, u := range r.rx.Used() {
			pkt := r.mem[addrs[i] : addrs[i]+uint64(u[1])]
			i++
			if hdr := pkt[:HeaderLen]; !bytes.Equal(hdr, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}) {
				t.Fatalf("header % x", hdr)
			}
			f := []byte(pkt[HeaderLen:])
			if len(f) < 42 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != 17 {
				continue
			}
			if !bytes.Equal(f[:6], guestMAC) || !bytes.Equal(f[6:12], r.hostMAC) {
				t.Fatalf("MACs %v -> %v", net.HardwareAddr(f[6:12]), net.HardwareAddr(f[:6]))
			}
			// No offloads: the kernel completed the checksums.
			d, err := netframe.ParseUDP(f)
			if err != nil {
				t.Fatalf("frame % x: %v", f, err)
			}
			if !bytes.Equal(d.Payload, payload) || d.Dst.Port() != 6667 {
				t.Fatalf("frame % x", f)
			}
			return
		}
		if i == len(addrs) || time.Now().After(deadline) {
			t.Fatalf("no UDP frame in %d received (rx packets %d, errors %d)", i, r.dev.Metrics.RxPackets.Load(), r.dev.Metrics.RxErrors.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// With no receive buffers the device reads one frame from the tap and stops;
// the tap's own queue takes the rest and the kernel drops what does not
// fit. Posting buffers resumes delivery with the oldest frame.
func TestTapNoBuffers(t *testing.T) {
	r := newTapRig(t)
	sock := r.udpSocket(t, 5557)
	const sent = 1500 // more than the tap's default queue of 1000
	for i := range sent {
		if _, err := sock.WriteToUDP([]byte(fmt.Sprintf("frame %04d", i)), &net.UDPAddr{IP: guestIP, Port: 6668}); err != nil {
			t.Fatal(err)
		}
	}
	kvmtest.WaitFor(t, 5*time.Second, "first tap read", func() bool { return r.tap.reads.Load() >= 1 })
	time.Sleep(100 * time.Millisecond)
	if n := r.tap.reads.Load(); n != 1 {
		t.Fatalf("%d tap reads without guest buffers, want 1", n)
	}
	stats := ip(t, "-n", r.ns, "-s", "-o", "link", "show", tapName)
	t.Logf("tap stats: %s", stats)

	var addrs []uint64
	for range 16 {
		_, a := r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
		addrs = append(addrs, a[0])
	}
	r.tr.Notify(rxQueue)
	u := waitUsed(t, r.rx, 16)
	first := r.mem[addrs[0]+HeaderLen : addrs[0]+uint64(u[0][1])]
	if !bytes.HasSuffix(first, []byte("frame 0000")) {
		t.Errorf("first frame delivered is not the oldest: % x", first)
	}
	start := time.Now()
	r.tr.Shutdown()
	if d := time.Since(start); d > time.Second {
		t.Errorf("shutdown with a tap read pending took %v", d)
	}
	if st := r.tr.Status(); st&virtio.StatusNeedsReset != 0 {
		t.Errorf("status %#x", st)
	}
}
