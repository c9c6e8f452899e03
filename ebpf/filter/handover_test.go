//go:build linux

package filter

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestHandover: a filter loaded and attached by one owner, handed over
// (Files) and let go (Release), is adopted (FromFiles) with its
// attachment intact; the adopter's table updates reach the attached
// program, its counters and events are the program's, and its Close (with
// tcx) detaches by closing the link.
func TestHandover(t *testing.T) {
	eachAttach(t, testHandover)
}

// attachedIDs returns the ids of the programs on the ingress of device
// idx, by either attachment.
func attachedIDs(t *testing.T, idx int) []ebpf.ProgramID {
	t.Helper()
	var ids []ebpf.ProgramID
	if res, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: ebpf.AttachTCXIngress}); err == nil {
		for _, p := range res.Programs {
			ids = append(ids, p.ID)
		}
	}
	flts, err := netlink.FilterList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}, netlink.HANDLE_MIN_INGRESS)
	if err == nil {
		for _, f := range flts {
			if b, ok := f.(*netlink.BpfFilter); ok {
				ids = append(ids, ebpf.ProgramID(b.Id))
			}
		}
	}
	return ids
}

func testHandover(t *testing.T, mode AttachMode) {
	enterNetns(t)
	openTap(t, tapName)
	lk, err := netlink.LinkByName(tapName)
	if err != nil {
		t.Fatal(err)
	}
	idx := lk.Attrs().Index
	f := loadOrSkip(t, testConf)
	if err := f.Attach(tapName, mode); err != nil {
		t.Fatal(err)
	}
	got := f.AttachedMode()
	info, err := f.objs.EgressFilter.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	files, err := f.Files()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	if ids := attachedIDs(t, idx); len(ids) != 1 || ids[0] != id {
		t.Fatalf("after Release the device's ingress has programs %v, want the filter's %d", ids, id)
	}
	var two []*os.File
	for _, fl := range files[:2] {
		d, err := unix.FcntlInt(fl.Fd(), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			t.Fatal(err)
		}
		two = append(two, os.NewFile(uintptr(d), "dup"))
	}
	if _, err := FromFiles(testConf, got, two); err == nil {
		t.Fatal("FromFiles took 2 descriptors")
	}
	if _, err := two[0].Stat(); err == nil {
		t.Error("FromFiles kept a descriptor it refused")
	}
	a, err := FromFiles(testConf, got, files)
	if err != nil {
		t.Fatal(err)
	}
	if a.AttachedMode() != got {
		t.Errorf("adopted mode %v, want %v", a.AttachedMode(), got)
	}
	// The adopter's table is the attached program's: a frame it denies
	// passes once the table allows it, and the counters see both.
	fr := tcpFrame(hostMAC, guestIP, ip("198.51.100.1"), 4000, 80)
	if ret := run(t, a, fr); ret != actShot {
		t.Errorf("before Sync: %d, want denied", ret)
	}
	if err := a.Sync(testTable(t)); err != nil {
		t.Fatal(err)
	}
	if ret := run(t, a, fr); ret != actOK {
		t.Errorf("after Sync: %d, want allowed", ret)
	}
	c, err := a.Counters()
	if err != nil || c.AllowedPackets < 1 || c.DeniedPackets < 1 {
		t.Errorf("counters %+v (%v), want an allowed and a denied packet", c, err)
	}
	if ev := readEvents(t, a); len(ev) < 2 {
		t.Errorf("%d events, want the deny and the flow's allow", len(ev))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ids := attachedIDs(t, idx)
	if got == AttachTCX && len(ids) != 0 {
		t.Errorf("after the adopter's Close the tcx link stays: %v", ids)
	}
	if got == AttachClsact && len(ids) != 1 {
		t.Errorf("clsact: after the adopter's Close %v attached, want it to stay with the device", ids)
	}
}
