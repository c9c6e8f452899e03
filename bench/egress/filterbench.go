package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/ebpf/filter"
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/internal/netframe"
)

// The benchmark's network, all inside the namespace it creates.
const (
	tapName     = "wrnbench0"
	echoPort    = 7
	guestPort   = 40000
	probeSize   = 64 // UDP payload bytes
	policyRules = 200
	// replyTimeout is how long a probe waits for its echo before it counts
	// as lost.
	replyTimeout = time.Second
	// switchWarmup probes follow each attach or detach, unrecorded.
	switchWarmup = 20
)

var (
	hostIP   = netip.MustParseAddr("10.210.0.1")
	guestIP  = netip.MustParseAddr("10.210.0.2")
	echoIP   = netip.MustParseAddr("198.51.100.7")
	guestMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x0b, 0x02}
)

// filterVariant is one way the tap's ingress is set up, and what was
// measured with it.
type filterVariant struct {
	name string
	mode filter.AttachMode // AttachNone: no filter
	f    *filter.Filter
	prog *ebpf.Program // the attached program, for its run-time stats

	rtt        []time.Duration
	cpu        time.Duration // process CPU over the recorded probes
	lost       int           // recorded probes without an echo
	written    uint64        // frames written while attached (warm-up too)
	bpfRuntime time.Duration // over the stats pass
	bpfRuns    uint64
}

// filterReport is part 1's result.
type filterReport struct {
	PinCPU       int    `json:"pin_cpu"`
	Packets      int    `json:"packets_per_variant"`
	Rounds       int    `json:"rounds"`
	PolicyRules  int    `json:"policy_rules"`
	TableEntries int    `json:"table_entries"`
	BPFStats     string `json:"bpf_stats"`
	// BPFStatsPackets are the probes per filter of the stats pass.
	BPFStatsPackets int                    `json:"bpf_stats_packets"`
	Variants        []filterVariantReport  `json:"variants"`
	Counters        map[string]counterView `json:"counters"`
}

type filterVariantReport struct {
	Name           string          `json:"name"`
	RTT            []time.Duration `json:"rtt_ns"`
	Lost           int             `json:"lost"`
	CPUPerPacket   time.Duration   `json:"cpu_ns_per_packet"`
	BPFNsPerRun    float64         `json:"bpf_ns_per_run,omitempty"`
	BPFRuns        uint64          `json:"bpf_runs,omitempty"`
	BPFRunsPerPkt  float64         `json:"bpf_runs_per_packet,omitempty"`
	RecordedFrames int             `json:"recorded_frames"`
}

// counterView is one filter's counters against the frames written while
// it was attached.
type counterView struct {
	Written uint64          `json:"frames_written"`
	Got     filter.Counters `json:"counters"`
	OK      bool            `json:"ok"`
}

// runFilterBench runs part 1 on a goroutine of its own, locked to its
// thread and never unlocked: that thread alone enters the new network
// namespace, and it exits with the goroutine, taking the namespace (and
// the tap and addresses in it) with it.
func runFilterBench(c config) (*filterReport, []*filterVariant, error) {
	type result struct {
		r   *filterReport
		v   []*filterVariant
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		r, v, err := filterBench(c)
		ch <- result{r, v, err}
	}()
	res := <-ch
	return res.r, res.v, res.err
}

// benchPolicy is the policy loaded in the filter: policyRules CIDR rules of
// various prefix lengths (mostly /32 and /24, as resolved names and
// service ranges are), protocols and ports, from a fixed seed; rule 1
// allows the echo server.
func benchPolicy() []policy.Rule {
	rng := rand.New(rand.NewPCG(7, 11))
	rules := []policy.Rule{{ID: 1, CIDR: netip.PrefixFrom(echoIP, 24).Masked(), Proto: "udp", Ports: "7"}}
	protos := []struct{ proto, ports string }{
		{"tcp", "443"}, {"tcp", "80"}, {"tcp", "8000-8100"}, {"udp", "53"},
		{"udp", "3478-3479"}, {"any", ""}, {"icmp", ""}, {"tcp", ""},
	}
	seen := map[netip.Prefix]bool{rules[0].CIDR: true}
	for len(rules) < policyRules {
		var bits int
		switch x := rng.IntN(100); {
		case x < 40:
			bits = 32
		case x < 65:
			bits = 24
		case x < 85:
			bits = 16 + rng.IntN(8)
		case x < 95:
			bits = 8 + rng.IntN(8)
		default:
			bits = 25 + rng.IntN(7)
		}
		first := byte(1 + rng.IntN(223))
		if first == 10 || first == 127 || first == echoIP.As4()[0] {
			continue
		}
		a := netip.AddrFrom4([4]byte{first, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
		p := netip.PrefixFrom(a, bits).Masked()
		if seen[p] {
			continue
		}
		seen[p] = true
		pp := protos[rng.IntN(len(protos))]
		rules = append(rules, policy.Rule{ID: uint32(len(rules) + 1), CIDR: p, Proto: pp.proto, Ports: pp.ports})
	}
	return rules
}

func sysctl(path, value string) error {
	if err := os.WriteFile("/proc/sys/"+path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s: %w", path, err)
	}
	return nil
}

func filterBench(c config) (rep *filterReport, variants []*filterVariant, err error) {
	ns, err := netns.New()
	if err != nil {
		return nil, nil, fmt.Errorf("new network namespace: %w", err)
	}
	defer ns.Close()

	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, nil, err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return nil, nil, fmt.Errorf("lo up: %w", err)
	}
	if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: echoIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		return nil, nil, fmt.Errorf("address on lo: %w", err)
	}

	fd, err := openTap(tapName)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(fd)
	tl, err := netlink.LinkByName(tapName)
	if err != nil {
		return nil, nil, err
	}
	if err := sysctl("net/ipv6/conf/"+tapName+"/disable_ipv6", "1"); err != nil {
		return nil, nil, err
	}
	for _, d := range []string{"all", "default", tapName} {
		if err := sysctl("net/ipv4/conf/"+d+"/rp_filter", "0"); err != nil {
			return nil, nil, err
		}
	}
	if err := netlink.AddrAdd(tl, &netlink.Addr{IPNet: &net.IPNet{IP: hostIP.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return nil, nil, fmt.Errorf("address on the tap: %w", err)
	}
	if err := netlink.LinkSetUp(tl); err != nil {
		return nil, nil, fmt.Errorf("tap up: %w", err)
	}
	neigh := &netlink.Neigh{LinkIndex: tl.Attrs().Index, IP: guestIP.AsSlice(), HardwareAddr: guestMAC, State: netlink.NUD_PERMANENT}
	if err := netlink.NeighAdd(neigh); err != nil {
		return nil, nil, fmt.Errorf("guest neighbour: %w", err)
	}
	end := time.Now().Add(3 * time.Second)
	for {
		if tl, err = netlink.LinkByName(tapName); err != nil {
			return nil, nil, err
		}
		if tl.Attrs().RawFlags&unix.IFF_LOWER_UP != 0 && tl.Attrs().Flags&net.FlagUp != 0 {
			break
		}
		if time.Now().After(end) {
			return nil, nil, errors.New("the tap did not come up within 3 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tapMAC := tl.Attrs().HardwareAddr

	// The fake guest and the echo server share one CPU: their wake-ups of
	// each other are then plain context switches, not cross-CPU wake-ups,
	// whose cost (an IPI, in a VM an exit) varies with where the scheduler
	// put them and would swamp the filter's share in the tails. The
	// thread is this goroutine's own and dies with it.
	if c.pinCPU >= 0 {
		var set unix.CPUSet
		set.Set(c.pinCPU)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return nil, nil, fmt.Errorf("pin to CPU %d: %w", c.pinCPU, err)
		}
	}
	stopEcho, err := startEcho(netip.AddrPortFrom(echoIP, echoPort), c.pinCPU)
	if err != nil {
		return nil, nil, fmt.Errorf("echo server: %w", err)
	}
	defer stopEcho()

	rules := benchPolicy()
	table, err := policy.Compile(rules, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("compile the policy: %w", err)
	}
	if r, ok := policy.Lookup(table, echoIP, policy.ProtoUDP, echoPort); !ok || r.RuleID != 1 {
		return nil, nil, fmt.Errorf("the policy does not allow the echo server by rule 1 (%+v %v)", r, ok)
	}
	variants = []*filterVariant{{name: "no filter", mode: filter.AttachNone}, {name: "tcx", mode: filter.AttachTCX}, {name: "clsact", mode: filter.AttachClsact}}
	for _, v := range variants[1:] {
		f, err := filter.Load(filter.Config{GuestIP: guestIP, Gateway: hostIP, ProxyPorts: []uint16{3128}})
		if err != nil {
			return nil, nil, fmt.Errorf("load the filter: %w", err)
		}
		defer f.Close()
		if err := f.Sync(table); err != nil {
			return nil, nil, err
		}
		v.f = f
	}
	defer func() {
		for _, v := range variants {
			if v.prog != nil {
				v.prog.Close()
			}
		}
	}()

	rep = &filterReport{PinCPU: c.pinCPU, Packets: c.packets, Rounds: c.rounds, PolicyRules: len(rules), TableEntries: len(table), Counters: map[string]counterView{}}
	p := &pinger{fd: fd, flow: netframe.UDPFlow{SrcMAC: guestMAC, DstMAC: tapMAC, Src: guestIP, Dst: echoIP, SrcPort: guestPort, DstPort: echoPort},
		rbuf: make([]byte, 65536)}
	// The tap may drop the first frames while its queue comes up: probe
	// until one is echoed, then warm up.
	up := false
	for range 100 {
		if _, ok, err := p.ping(50 * time.Millisecond); err != nil {
			return nil, nil, err
		} else if ok {
			up = true
			break
		}
	}
	if !up {
		return nil, nil, errors.New("no echo through the tap within 5 s")
	}
	var cur *filterVariant // attached now
	attach := func(v *filterVariant) error {
		if cur != nil && cur.f != nil {
			if err := cur.f.Detach(); err != nil {
				return err
			}
		}
		cur = v
		if v.f == nil {
			return nil
		}
		if err := v.f.Attach(tapName, v.mode); err != nil {
			return err
		}
		if got := v.f.AttachedMode(); got != v.mode {
			return fmt.Errorf("attached with %v, asked %v", got, v.mode)
		}
		if v.prog == nil {
			prog, err := attachedProgram(tl, v.mode)
			if err != nil {
				return fmt.Errorf("find the %v program: %w", v.mode, err)
			}
			v.prog = prog
		}
		return nil
	}
	// send sends n probes; record keeps their round trips and CPU, and
	// bpf the program's run-time stats.
	send := func(v *filterVariant, n int, record, bpf bool) error {
		var st0 *ebpf.ProgramStats
		if bpf && v.prog != nil {
			st, err := v.prog.Stats()
			if err != nil {
				return err
			}
			st0 = st
		}
		c0 := processCPU()
		w0 := p.written
		for range n {
			d, ok, err := p.ping(replyTimeout)
			if err != nil {
				return err
			}
			if !record {
				continue
			}
			if !ok {
				v.lost++
				continue
			}
			v.rtt = append(v.rtt, d)
		}
		if v.f != nil {
			v.written += p.written - w0
		}
		if record {
			v.cpu += processCPU() - c0
		}
		if st0 != nil {
			st1, err := v.prog.Stats()
			if err != nil {
				return err
			}
			v.bpfRuntime += st1.Runtime - st0.Runtime
			v.bpfRuns += st1.RunCount - st0.RunCount
		}
		return nil
	}
	for _, v := range variants { // warm-up of each
		if err := attach(v); err != nil {
			return nil, nil, err
		}
		if err := send(v, max(200, c.packets/20), false, false); err != nil {
			return nil, nil, err
		}
	}
	for r := range c.rounds {
		n := c.packets / c.rounds
		if r < c.packets%c.rounds {
			n++
		}
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			if err := attach(v); err != nil {
				return nil, nil, err
			}
			if err := send(v, switchWarmup, false, false); err != nil {
				return nil, nil, err
			}
			if err := send(v, n, true, false); err != nil {
				return nil, nil, err
			}
		}
	}
	// The program's own time per run, in a pass of its own: the run-time
	// statistics cost a clock read or two per run, kept out of the rounds.
	statsOff, how := enableBPFStats()
	rep.BPFStats = how
	rep.BPFStatsPackets = max(1000, c.packets/4)
	for _, v := range variants[1:] {
		if err := attach(v); err != nil {
			statsOff()
			return nil, nil, err
		}
		if err := send(v, switchWarmup, false, false); err != nil {
			statsOff()
			return nil, nil, err
		}
		if err := send(v, rep.BPFStatsPackets, false, true); err != nil {
			statsOff()
			return nil, nil, err
		}
	}
	statsOff()
	if err := attach(variants[0]); err != nil {
		return nil, nil, err
	}
	if p.bad > 0 {
		fmt.Fprintf(os.Stderr, "filter: %d frames read from the tap were not echoes of the probes\n", p.bad)
	}
	for _, v := range variants {
		vr := filterVariantReport{Name: v.name, RTT: v.rtt, Lost: v.lost, RecordedFrames: len(v.rtt) + v.lost}
		if n := vr.RecordedFrames; n > 0 {
			vr.CPUPerPacket = v.cpu / time.Duration(n)
			if v.bpfRuns > 0 {
				vr.BPFNsPerRun = float64(v.bpfRuntime) / float64(v.bpfRuns)
				vr.BPFRuns = v.bpfRuns
				vr.BPFRunsPerPkt = float64(v.bpfRuns) / float64(rep.BPFStatsPackets)
			}
		}
		rep.Variants = append(rep.Variants, vr)
		if v.f != nil {
			got, err := v.f.Counters()
			if err != nil {
				return nil, nil, err
			}
			rep.Counters[v.name] = counterView{Written: v.written, Got: got,
				OK: got.AllowedPackets == v.written && got.DeniedPackets == 0}
		}
	}
	return rep, variants, nil
}

// openTap creates the tap (IFF_TAP|IFF_NO_PI, non-blocking) in the calling
// thread's namespace and returns its fd.
func openTap(name string) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TUNSETIFF: %w", err)
	}
	return fd, nil
}

// attachedProgram opens the program attached to the tap's ingress by mode
// (ebpf/filter does not export it): tcx by a BPF_PROG_QUERY of the
// interface, clsact by the cls_bpf filter's program id.
func attachedProgram(tl netlink.Link, mode filter.AttachMode) (*ebpf.Program, error) {
	var id ebpf.ProgramID
	switch mode {
	case filter.AttachTCX:
		res, err := link.QueryPrograms(link.QueryOptions{Target: tl.Attrs().Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return nil, err
		}
		if len(res.Programs) != 1 {
			return nil, fmt.Errorf("%d tcx ingress programs, want 1", len(res.Programs))
		}
		id = res.Programs[0].ID
	case filter.AttachClsact:
		fs, err := netlink.FilterList(tl, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			if b, ok := f.(*netlink.BpfFilter); ok && b.Id != 0 {
				if id != 0 {
					return nil, errors.New("more than one cls_bpf ingress filter")
				}
				id = ebpf.ProgramID(b.Id)
			}
		}
		if id == 0 {
			return nil, errors.New("no cls_bpf ingress filter")
		}
	default:
		return nil, fmt.Errorf("mode %v", mode)
	}
	return ebpf.NewProgramFromID(id)
}

// enableBPFStats turns on the kernel's BPF run-time statistics: with
// BPF_ENABLE_STATS (on while the fd is open) or, failing that, the
// kernel.bpf_stats_enabled sysctl, restored after. It returns the undo and
// how it did it.
func enableBPFStats() (func(), string) {
	if cl, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		return func() { cl.Close() }, "BPF_ENABLE_STATS(BPF_STATS_RUN_TIME)"
	}
	const path = "/proc/sys/kernel/bpf_stats_enabled"
	old, err := os.ReadFile(path)
	if err != nil {
		return func() {}, "unavailable: " + err.Error()
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return func() {}, "unavailable: " + err.Error()
	}
	restoreSysctl = func() { os.WriteFile(path, old, 0o644) }
	return func() { restoreSysctl(); restoreSysctl = nil }, "sysctl kernel.bpf_stats_enabled=1 (restored after)"
}

// restoreSysctl undoes the fallback of enableBPFStats; main's signal
// handler calls it too.
var restoreSysctl func()

// pinger is the fake guest: it writes a probe into the tap and waits for
// its echo.
type pinger struct {
	fd      int
	flow    netframe.UDPFlow
	seq     uint64
	written uint64
	bad     int // frames read that are not echoes of a probe
	wbuf    []byte
	pbuf    []byte
	rbuf    []byte
}

// ping sends one probe and returns its round trip, or ok false when no
// echo came within timeout.
func (p *pinger) ping(timeout time.Duration) (rtt time.Duration, ok bool, err error) {
	p.seq++
	p.pbuf = probePayload(p.pbuf, p.seq, probeSize)
	p.wbuf = netframe.AppendUDP(p.wbuf[:0], p.flow, uint16(p.seq), p.pbuf)
	pfd := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	t0 := time.Now()
	if _, err := unix.Write(p.fd, p.wbuf); err != nil {
		return 0, false, fmt.Errorf("write to the tap: %w", err)
	}
	p.written++
	deadline := t0.Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return 0, false, nil
		}
		_, err := unix.Poll(pfd, int(left/time.Millisecond)+1)
		if err != nil && err != unix.EINTR {
			return 0, false, fmt.Errorf("poll the tap: %w", err)
		}
		for {
			n, err := unix.Read(p.fd, p.rbuf)
			if err == unix.EAGAIN || err == unix.EINTR {
				break
			}
			if err != nil {
				return 0, false, fmt.Errorf("read the tap: %w", err)
			}
			pk, perr := netframe.ParseUDP(p.rbuf[:n])
			if perr != nil || pk.Src != netip.AddrPortFrom(p.flow.Dst, p.flow.DstPort) || pk.Dst != netip.AddrPortFrom(p.flow.Src, p.flow.SrcPort) {
				p.bad++
				continue
			}
			if s, ok := probeSeq(pk.Payload); ok && s == p.seq {
				return time.Since(t0), true, nil
			}
			// An echo of an earlier probe given up on.
		}
	}
}

// startEcho starts the UDP echo server on addr: a blocking socket read and
// written back by a goroutine locked to a thread of its own, with plain
// system calls (no netpoller hand-offs between the two), pinned to CPU pin
// unless it is negative. The socket is made in the calling thread's
// namespace. stop ends it and closes the socket.
func startEcho(addr netip.AddrPort, pin int) (stop func(), err error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	tv := unix.Timeval{Usec: 100000} // so that the loop sees stop
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	var stopping atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if pin >= 0 {
			var set unix.CPUSet
			set.Set(pin)
			_ = unix.SchedSetaffinity(0, &set) // checked by the caller's own pinning
		}
		buf := make([]byte, 2048)
		for !stopping.Load() {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue // EAGAIN at the timeout, EINTR
			}
			_ = unix.Sendto(fd, buf[:n], 0, from)
		}
	}()
	return func() {
		stopping.Store(true)
		<-done
		unix.Close(fd)
	}, nil
}
