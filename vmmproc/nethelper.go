package vmmproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	vnet "github.com/warrenvm/warren/devices/virtio/net"
	"github.com/warrenvm/warren/ebpf/filter"
	"github.com/warrenvm/warren/vmmproc/egress"
	"github.com/warrenvm/warren/vmmproc/jail"
	"golang.org/x/sys/unix"
)

// A private network made by the VMM family's helper: a jailed VMM that
// warren-hostd starts (under `jail-init --net-helper`) leaves root and
// keeps no capability to make networks, so it asks jail-init, which stays
// root for the family's life (vmmproc/jail's helper), for its private
// network: a new network namespace holding the tap and, with egress, the
// tap's host address, the filter loaded and attached, and the resolver's
// and proxy's listening sockets (egress.Prepare), all handed over as
// descriptors; the namespace lives as long as they are open. Its fork
// children ask the same helper for theirs (fork.go). The VMM keeps its own
// threads in the host's network namespace, where the resolver's and the
// proxy's upstream connections go out, as an unprivileged uid.
//
// The helper is the one door from a confined VMM back to root, so it does
// only this: a private namespace (never the host's, where a tap name could
// be another sandbox's or a host interface), a tap of a valid name in it,
// the egress pieces for a host address in it; at most netHelperBurst
// networks at once and netHelperRate a second after that.

// netRequest is what a VMM asks its helper for.
type netRequest struct {
	Tap    string            `json:"tap"`
	Egress *netEgressRequest `json:"egress,omitempty"`
}

// netEgressRequest is egress.PrepareConfig on the wire.
type netEgressRequest struct {
	HostAddr  netip.Prefix `json:"host_addr"`
	GuestAddr netip.Addr   `json:"guest_addr"`
	IPv6      bool         `json:"ipv6,omitempty"`
	Attach    string       `json:"attach,omitempty"`
}

// netReply is the helper's answer; the descriptors are the tap's, the
// namespace's, then, with egress, egress.Prepared.Files'.
type netReply struct {
	Attach string `json:"attach,omitempty"` // the filter's attach mode in force
}

// tapNameRE is what a tap the helper makes may be called.
var tapNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,14}$`)

const (
	netHelperBurst = 64
	netHelperRate  = 8 // per second, after the burst
)

// netRateLimit is a helper's token bucket for networks: netHelperBurst
// at once, then netHelperRate a second. Its mutex guards the rest.
type netRateLimit struct {
	sync.Mutex
	tokens float64
	last   time.Time
}

// newNetRateLimit is a full bucket.
func newNetRateLimit() *netRateLimit { return &netRateLimit{tokens: netHelperBurst} }

// allow takes a token, reporting whether there was one.
func (l *netRateLimit) allow() bool {
	l.Lock()
	defer l.Unlock()
	now := time.Now()
	if !l.last.IsZero() {
		l.tokens = min(netHelperBurst, l.tokens+now.Sub(l.last).Seconds()*netHelperRate)
	}
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// openDevNet opens /dev/net for jail-init's helper now: the VMM
// pivot_roots in jail-init's mount namespace, which changes jail-init's
// root too, to a jail without the tun device.
func openDevNet() (int, error) {
	devNet, err := unix.Open("/dev/net", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("net helper: %w", err)
	}
	return devNet, nil
}

// serveNetRequest serves one request, opening taps through devNet, if
// limit has a token for it.
func serveNetRequest(devNet int, limit *netRateLimit, req netRequest) ([]byte, []*os.File, error) {
	if !tapNameRE.MatchString(req.Tap) {
		return nil, nil, fmt.Errorf("tap name %q: want a letter then up to 14 letters, digits, '-' or '_'", req.Tap)
	}
	if !limit.allow() {
		return nil, nil, errors.New("too many networks asked for: try again later")
	}
	n, err := makePrivateNet(devNet, req)
	if err != nil {
		return nil, nil, err
	}
	files := []*os.File{n.tap, n.ns}
	var rep netReply
	if n.prep != nil {
		pf, mode, err := n.prep.Files()
		if err != nil {
			n.close()
			return nil, nil, err
		}
		n.prep.Release()
		files, rep.Attach = append(files, pf...), mode.String()
	}
	out, err := json.Marshal(rep)
	if err != nil {
		for _, f := range files {
			f.Close()
		}
		return nil, nil, err
	}
	return out, files, nil
}

// privateNet is a private network made: its tap, namespace and egress
// pieces.
type privateNet struct {
	tap, ns *os.File
	prep    *egress.Prepared // nil without egress
}

func (n *privateNet) close() {
	if n.prep != nil {
		n.prep.Close()
	}
	n.tap.Close()
	n.ns.Close()
}

// makePrivateNet makes req's network in a new network namespace (needs
// CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF and CAP_NET_BIND_SERVICE), its tap
// opened through devNet (a descriptor of /dev/net).
func makePrivateNet(devNet int, req netRequest) (*privateNet, error) {
	n := &privateNet{}
	h, err := inPrivateNetns(func() error {
		tap, err := vnet.OpenTapAt(devNet, "tun", req.Tap)
		if err != nil {
			return err
		}
		n.tap = tap
		if e := req.Egress; e != nil {
			mode, err := ParseAttach(e.Attach)
			if err == nil {
				n.prep, err = egress.Prepare(egress.PrepareConfig{Tap: req.Tap, HostAddr: e.HostAddr,
					GuestAddr: e.GuestAddr, IPv6: e.IPv6, Attach: mode})
			}
			if err != nil {
				tap.Close()
				return fmt.Errorf("--egress: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	n.ns = os.NewFile(uintptr(h), "netns")
	return n, nil
}

// askPrivateNet has the helper make o's private network and adopts it: the
// tap as a device backend file, the namespace, the egress pieces for
// startEgress.
func askPrivateNet(conn *os.File, o vmOptions) (*os.File, netns.NsHandle, *egress.Prepared, error) {
	req := netRequest{Tap: o.tap}
	var pc egress.PrepareConfig
	if e := o.egress; e != nil {
		req.Egress = &netEgressRequest{HostAddr: e.HostAddr, GuestAddr: e.GuestAddr, IPv6: e.State.Policy.IPv6, Attach: e.Attach}
		pc = egress.PrepareConfig{Tap: o.tap, HostAddr: e.HostAddr, GuestAddr: e.GuestAddr, IPv6: e.State.Policy.IPv6}
	}
	b, err := json.Marshal(helperRequest{Net: &req})
	if err != nil {
		return nil, -1, nil, err
	}
	out, files, err := jail.CallHelper(conn, b, nil, 30*time.Second)
	if err != nil {
		return nil, -1, nil, fmt.Errorf("private network: %w", err)
	}
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	var rep netReply
	if err := json.Unmarshal(out, &rep); err != nil || len(files) < 2 {
		closeFiles()
		return nil, -1, nil, fmt.Errorf("private network: the helper's reply (%d descriptors): %v", len(files), err)
	}
	// The tap, non-blocking (the helper's copy may have left the shared
	// description blocking) so that the poller serves it.
	fd, err := unix.FcntlInt(files[0].Fd(), unix.F_DUPFD_CLOEXEC, 3)
	if err == nil {
		err = unix.SetNonblock(fd, true)
		if err != nil {
			unix.Close(fd)
		}
	}
	files[0].Close()
	if err != nil {
		closeFiles()
		return nil, -1, nil, fmt.Errorf("private network: tap: %w", err)
	}
	tap := os.NewFile(uintptr(fd), o.tap)
	if err := tap.SetReadDeadline(time.Time{}); err != nil {
		tap.Close()
		closeFiles()
		return nil, -1, nil, fmt.Errorf("private network: tap %q: not pollable: %w", o.tap, err)
	}
	// The namespace: kept as a handle (it is the same as the tap's).
	nsfd, err := unix.FcntlInt(files[1].Fd(), unix.F_DUPFD_CLOEXEC, 3)
	files[1].Close()
	if err != nil {
		tap.Close()
		closeFiles()
		return nil, -1, nil, fmt.Errorf("private network: namespace: %w", err)
	}
	ns := netns.NsHandle(nsfd)
	fail := func(err error) (*os.File, netns.NsHandle, *egress.Prepared, error) {
		tap.Close()
		ns.Close()
		return nil, -1, nil, err
	}
	if o.egress == nil {
		if len(files) != 2 {
			closeFiles()
			return fail(fmt.Errorf("private network: %d descriptors for a bare tap", len(files)))
		}
		return tap, ns, nil, nil
	}
	mode, err := parseFilterMode(rep.Attach)
	if err != nil {
		closeFiles()
		return fail(err)
	}
	prep, err := egress.PreparedFromFiles(pc, mode, files[2:])
	if err != nil {
		return fail(fmt.Errorf("private network: %w", err))
	}
	return tap, ns, prep, nil
}

// parseFilterMode parses an attach mode the helper reports in force.
func parseFilterMode(s string) (filter.AttachMode, error) {
	for _, m := range []filter.AttachMode{filter.AttachTCX, filter.AttachClsact} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("private network: the helper reports attach mode %q", s)
}
