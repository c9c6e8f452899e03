package filter

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// A filter may be loaded and attached by one process and run by another:
// a privileged helper loads and attaches it (which needs CAP_BPF and
// CAP_NET_ADMIN), hands its descriptors over (Files) and lets go of its
// own (Release); the VMM, with no capability, adopts them (FromFiles) and
// updates the maps, reads the counters and the events for the filter's
// life. The attachment lives as long as the device (clsact) or the link's
// descriptors (tcx, whose link is among the files): the adopter never
// detaches, it closes.

// handoverNames are the objects Files hands over, in order; a tcx link
// follows when attached with tcx.
var handoverNames = []string{"egress_filter", "allow_v4", "config_map", "counters_map", "events_ringbuf", "flows"}

// Files returns duplicates of the descriptors FromFiles needs (the caller
// closes them): the program, the maps and, with tcx, the link.
func (f *Filter) Files() ([]*os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, os.ErrClosed
	}
	fds := []int{f.objs.EgressFilter.FD(), f.objs.AllowV4.FD(), f.objs.ConfigMap.FD(), f.objs.CountersMap.FD(),
		f.objs.EventsRingbuf.FD(), f.objs.Flows.FD()}
	names := append([]string(nil), handoverNames...)
	if f.tcx != nil {
		l, ok := f.tcx.(interface{ FD() int })
		if !ok {
			return nil, errors.New("ebpf/filter: the tcx link has no descriptor")
		}
		fds, names = append(fds, l.FD()), append(names, "tcx_link")
	}
	files := make([]*os.File, 0, len(fds))
	for i, fd := range fds {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			for _, g := range files {
				g.Close()
			}
			return nil, fmt.Errorf("ebpf/filter: dup %s: %w", names[i], err)
		}
		files = append(files, os.NewFile(uintptr(d), names[i]))
	}
	return files, nil
}

// Release lets go of the filter's objects without detaching it (after
// Files: the adopter's descriptors keep the program, maps and link).
func (f *Filter) Release() error {
	return f.closeOnce(func() error {
		if f.tcx != nil {
			// Closing our descriptor of the link leaves it attached
			// while the adopter's copy is open.
			f.tcx.Close()
		}
		f.tcx, f.clsact, f.qdisc, f.mode = nil, nil, nil, AttachNone
		if f.nlh != nil {
			f.nlh.Close()
			f.nlh = nil
		}
		f.reader.Close()
		return f.objs.Close()
	})
}

// FromFiles adopts a filter from the files another process's Files gave
// (it takes them: they are closed, whatever the outcome), loaded with cfg
// and attached with mode. Its Close releases the objects and never
// detaches. The configuration and the table start as Load leaves them.
func FromFiles(cfg Config, mode AttachMode, files []*os.File) (_ *Filter, err error) {
	defer func() {
		for _, fl := range files {
			fl.Close()
		}
	}()
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	want := len(handoverNames)
	if mode == AttachTCX {
		want++
	}
	if len(files) != want {
		return nil, fmt.Errorf("ebpf/filter: %d descriptors handed over, want %d", len(files), want)
	}
	dup := func(i int) (int, error) {
		return unix.FcntlInt(files[i].Fd(), unix.F_DUPFD_CLOEXEC, 3)
	}
	f := &Filter{table: map[netip.Prefix]egressAllowVal{}, cfg: cfg, gen: 1, mode: mode}
	defer func() {
		if err != nil {
			if f.link != nil {
				f.link.Close()
			}
			f.objs.Close()
		}
	}()
	maps := []**ebpf.Map{&f.objs.AllowV4, &f.objs.ConfigMap, &f.objs.CountersMap, &f.objs.EventsRingbuf, &f.objs.Flows}
	for i := range handoverNames {
		fd, err := dup(i)
		if err != nil {
			return nil, fmt.Errorf("ebpf/filter: adopt %s: %w", handoverNames[i], err)
		}
		if i == 0 {
			f.objs.EgressFilter, err = ebpf.NewProgramFromFD(fd)
		} else {
			*maps[i-1], err = ebpf.NewMapFromFD(fd)
		}
		if err != nil {
			return nil, fmt.Errorf("ebpf/filter: adopt %s: %w", handoverNames[i], err)
		}
	}
	if f.objs.EventsRingbuf.Type() != ebpf.RingBuf || f.objs.AllowV4.Type() != ebpf.LPMTrie {
		return nil, errors.New("ebpf/filter: the handed-over maps are not the filter's")
	}
	if mode == AttachTCX {
		f.link = files[len(handoverNames)]
		files = files[:len(handoverNames)]
	}
	if f.reader, err = ringbuf.NewReader(f.objs.EventsRingbuf); err != nil {
		return nil, fmt.Errorf("ebpf/filter: ring buffer: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err == nil {
		f.monoOff = time.Duration(time.Now().UnixNano() - ts.Nano())
	}
	return f, nil
}
