// Command hostiledev is a hostile driver run as root inside a Warren guest:
// for a while it writes random values to every virtio-mmio window's
// registers and brings the devices' queues up on descriptor tables of its
// own making (chains that loop, indirect tables inside indirect tables,
// buffers outside guest RAM, lengths past any limit, available indexes
// that jump), notifying them so that the VMM parses the garbage. The VMM
// must survive it and refuse the garbage (a device goes to NEEDS_RESET);
// the guest is not expected to be of any use afterwards.
//
//	hostiledev [-d 60s] [-seed N] [-detach]
//
// It finds the windows on the kernel command line (virtio_mmio.device=
// SIZE@ADDR:IRQ, as the VMM passes them), unbinds the guest's own
// virtio-mmio driver from each (so the guest kernel stops using them, and
// its own confusion cannot end the run early), maps them through /dev/mem
// and finds its own pages' guest-physical addresses in /proc/self/pagemap.
// Every address it gives a device is inside its own locked pages or beyond
// guest RAM, so a device that does follow a descriptor writes nowhere else
// in the guest. At the end it prints one line beginning "hostiledev:
// survived" with what it did, and exits 0.
//
// With -detach it starts itself again in a session of its own with its
// output on /dev/console and returns at once: the agent's exec that started
// it runs over a virtio device this program is about to take away.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	reg "github.com/warrenvm/warren/internal/virtiommio"
)

func main() {
	d := flag.Duration("d", time.Minute, "how long to run")
	seed := flag.Uint64("seed", 0, "random seed (0: from the clock)")
	detach := flag.Bool("detach", false, "start in the background with output on /dev/console, and return")
	flag.Parse()
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	if *detach {
		pid, err := background([]string{"-d", d.String(), "-seed", strconv.FormatUint(*seed, 10)})
		if err != nil {
			fail(err)
		}
		fmt.Printf("hostiledev: started pid %d for %v, seed %d\n", pid, *d, *seed)
		return
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		fail(err)
	}
	wins, err := parseWindows(string(cmdline))
	if err != nil {
		fail(err)
	}
	if len(wins) == 0 {
		fail(errors.New("no virtio_mmio.device= on the kernel command line"))
	}
	fmt.Printf("hostiledev: %d windows, %v, seed %d; unbound %d drivers\n", len(wins), *d, *seed, unbindAll())
	h, err := open(wins, newRand(*seed))
	if err != nil {
		fail(err)
	}
	for end := time.Now().Add(*d); time.Now().Before(end); {
		for range 64 {
			h.turn()
		}
	}
	fmt.Printf("hostiledev: survived %v: %d register writes, %d reads, %d queue bring-ups, %d notifies; windows seen in NEEDS_RESET: %d of %d\n",
		*d, h.writes, h.reads, h.bringUps, h.notifies, h.resetSeen(), len(wins))
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed>>1|1)) }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "hostiledev:", err)
	os.Exit(1)
}

// background runs this program again with args, in a session of its own,
// output on /dev/console.
func background(args []string) (int, error) {
	con, err := os.OpenFile("/dev/console", os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer con.Close()
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	// argv[0] names the command: in a busybox-style initramfs binary it
	// picks which one runs.
	cmd := &exec.Cmd{Path: self, Args: append([]string{"hostiledev"}, args...), Stdout: con, Stderr: con,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid // Release clears it
	return pid, cmd.Process.Release()
}

// window is one virtio-mmio device's register window.
type window struct {
	addr, size uint64
}

// parseWindows reads the virtio_mmio.device=SIZE@ADDR:IRQ[:ID] entries of
// a kernel command line. SIZE takes K or M; sizes are bounded to a page
// (the VMM's windows are 512 bytes).
func parseWindows(cmdline string) ([]window, error) {
	var ws []window
	for _, f := range strings.Fields(cmdline) {
		v, ok := strings.CutPrefix(f, "virtio_mmio.device=")
		if !ok {
			continue
		}
		sz, rest, ok := strings.Cut(v, "@")
		if !ok {
			return nil, fmt.Errorf("%q: no @", f)
		}
		addr, _, _ := strings.Cut(rest, ":")
		mult := uint64(1)
		switch {
		case strings.HasSuffix(sz, "K"), strings.HasSuffix(sz, "k"):
			mult, sz = 1<<10, sz[:len(sz)-1]
		case strings.HasSuffix(sz, "M"):
			mult, sz = 1<<20, sz[:len(sz)-1]
		}
		n, err := strconv.ParseUint(sz, 0, 32)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q: bad size", f)
		}
		a, err := strconv.ParseUint(addr, 0, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: bad address", f)
		}
		ws = append(ws, window{addr: a, size: min(n*mult, pageSize)})
	}
	return ws, nil
}

// unbindAll detaches the guest's virtio-mmio driver from every device it
// holds and returns how many.
func unbindAll() int {
	const drv = "/sys/bus/platform/drivers/virtio-mmio"
	devs, _ := filepath.Glob(drv + "/virtio-mmio.*")
	n := 0
	for _, d := range devs {
		if os.WriteFile(drv+"/unbind", []byte(filepath.Base(d)), 0) == nil {
			n++
		}
	}
	return n
}

const (
	pageSize = 4096
	// scratchPages is the memory the queues and buffers live in.
	scratchPages = 64
	// outside is added to a scratch address to make one far beyond any
	// guest's RAM whose low half is still a scratch address: a device
	// given one half of it and the other half of another (the queue
	// address registers are written in halves) still lands in scratch
	// or outside RAM, never in the rest of the guest.
	outside = 0xfff0_0000_0000
)

// regs are the registers a random write picks from, the queue and status
// ones more often than the rest; -1 is any offset in the window.
var regs = []int{reg.Status, reg.Status, reg.QueueSel, reg.QueueNum, reg.QueueReady, reg.QueueReady,
	reg.QueueNotify, reg.QueueNotify, reg.QueueDescLow, reg.QueueDriverLow, reg.QueueDeviceLow,
	reg.QueueDescHigh, reg.DriverFeatures, reg.DriverFeaturesSel, reg.DeviceFeaturesSel, reg.InterruptACK, -1, -1}

// hostile holds the mapped windows and the scratch pages.
type hostile struct {
	rng     *rand.Rand
	mmio    [][]byte // one page-aligned mapping per window
	off     []uint64 // the window's offset in its mapping
	scratch []byte
	phys    []uint64 // guest-physical address of each scratch page
	seen    []bool   // window i was read back in NEEDS_RESET

	writes, reads, bringUps, notifies int
}

func open(wins []window, rng *rand.Rand) (*hostile, error) {
	mem, err := os.OpenFile("/dev/mem", os.O_RDWR|syscall.O_SYNC, 0)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	h := &hostile{rng: rng, seen: make([]bool, len(wins))}
	for _, w := range wins {
		base := w.addr &^ (pageSize - 1)
		m, err := syscall.Mmap(int(mem.Fd()), int64(base), pageSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("map the window at %#x: %w", w.addr, err)
		}
		h.mmio, h.off = append(h.mmio, m), append(h.off, w.addr-base)
	}
	h.scratch, err = syscall.Mmap(-1, 0, scratchPages*pageSize, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_POPULATE|syscall.MAP_LOCKED)
	if err != nil {
		return nil, err
	}
	if err := syscall.Mlock(h.scratch); err != nil {
		return nil, err
	}
	for i := range h.scratch {
		h.scratch[i] = byte(rng.Uint32())
	}
	if h.phys, err = physAddrs(h.scratch); err != nil {
		return nil, err
	}
	return h, nil
}

// physAddrs returns the guest-physical address of each page of b (locked
// and present) from /proc/self/pagemap.
func physAddrs(b []byte) ([]uint64, error) {
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	var out []uint64
	var e [8]byte
	for p := 0; p < len(b); p += pageSize {
		v := uint64(uintptr(unsafe.Pointer(&b[p])))
		if _, err := pm.ReadAt(e[:], int64(v/pageSize*8)); err != nil {
			return nil, err
		}
		x := binary.LittleEndian.Uint64(e[:])
		pfn := x & (1<<55 - 1)
		if x>>63 == 0 || pfn == 0 {
			return nil, fmt.Errorf("pagemap: page %#x not present (%#x)", v, x)
		}
		out = append(out, pfn*pageSize)
	}
	return out, nil
}

func (h *hostile) reg(w, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&h.mmio[w][h.off[w]+uint64(off)]))
}

func (h *hostile) write(w, off int, v uint32) {
	*h.reg(w, off) = v
	h.writes++
}

func (h *hostile) read(w, off int) uint32 {
	h.reads++
	v := *h.reg(w, off)
	if off == reg.Status && v&reg.StatusNeedsReset != 0 {
		h.seen[w] = true
	}
	return v
}

func (h *hostile) resetSeen() int {
	n := 0
	for _, s := range h.seen {
		if s {
			n++
		}
	}
	return n
}

// addr is a random guest-physical address a device may be given: inside
// the scratch pages (most of the time), just past their end, or far
// outside guest RAM.
func (h *hostile) addr(align uint64) uint64 {
	p := h.rng.IntN(len(h.phys))
	a := h.phys[p] + h.rng.Uint64N(pageSize)&^(align-1)
	switch h.rng.IntN(16) {
	case 0:
		return outside + a
	case 1:
		return h.phys[len(h.phys)-1] + pageSize - align // the last bytes of scratch
	}
	return a
}

// at returns the scratch bytes at guest-physical address a, or nil where a
// is not in the scratch pages (or runs off the end of one).
func (h *hostile) at(a uint64, n int) []byte {
	for i, p := range h.phys {
		if a >= p && a+uint64(n) <= p+pageSize {
			o := i*pageSize + int(a-p)
			return h.scratch[o : o+n]
		}
	}
	return nil
}

// Descriptor flags.
const (
	descNext     = 1
	descWrite    = 2
	descIndirect = 4
)

// descriptors fills a descriptor table of n entries at table with one of
// the shapes a hostile driver would try.
func (h *hostile) descriptors(table []byte, n int) {
	put := func(i int, addr uint64, length uint32, flags, next uint16) {
		d := table[16*i:]
		binary.LittleEndian.PutUint64(d, addr)
		binary.LittleEndian.PutUint32(d[8:], length)
		binary.LittleEndian.PutUint16(d[12:], flags)
		binary.LittleEndian.PutUint16(d[14:], next)
	}
	for i := range n {
		switch h.rng.IntN(8) {
		case 0: // a loop back to the head
			put(i, h.addr(1), uint32(h.rng.IntN(4096)), descNext|uint16(h.rng.IntN(2))*descWrite, 0)
		case 1: // an indirect table, which may hold another indirect one
			ind := h.addr(16)
			put(i, ind, uint32(16*(1+h.rng.IntN(512))), descIndirect|uint16(h.rng.IntN(2))*descNext, uint16(h.rng.IntN(n)))
			if t := h.at(ind, 64); t != nil {
				for j := 0; j < 4; j++ {
					binary.LittleEndian.PutUint64(t[16*j:], h.addr(1))
					binary.LittleEndian.PutUint32(t[16*j+8:], uint32(h.rng.IntN(8192)))
					binary.LittleEndian.PutUint16(t[16*j+12:], uint16(h.rng.IntN(8)))
					binary.LittleEndian.PutUint16(t[16*j+14:], uint16(h.rng.IntN(8)))
				}
			}
		case 2: // a buffer outside guest RAM
			put(i, outside+h.addr(1), 4096, uint16(h.rng.IntN(4)), uint16(h.rng.IntN(n)))
		case 3: // a length past any limit
			put(i, h.addr(1), h.rng.Uint32()|1<<31, uint16(h.rng.IntN(4)), uint16(i+1))
		case 4: // next out of the table
			put(i, h.addr(1), 64, descNext, uint16(n+h.rng.IntN(1000)))
		default: // plausible: a short chain within the table
			put(i, h.addr(1), uint32(1+h.rng.IntN(512)), uint16(h.rng.IntN(2))*descWrite|descNext*uint16(h.rng.IntN(2)), uint16((i+1)%n))
		}
	}
}

// bringUp resets window w and brings it up as a driver would, but on
// queues of its own making, then notifies them.
func (h *hostile) bringUp(w int) {
	h.bringUps++
	h.write(w, reg.Status, 0)
	h.write(w, reg.Status, reg.StatusAcknowledge)
	h.write(w, reg.Status, reg.StatusAcknowledge|reg.StatusDriver)
	for sel := uint32(0); sel < 2; sel++ {
		h.write(w, reg.DeviceFeaturesSel, sel)
		f := h.read(w, reg.DeviceFeatures)
		if h.rng.IntN(4) == 0 {
			f = h.rng.Uint32()
		}
		h.write(w, reg.DriverFeaturesSel, sel)
		h.write(w, reg.DriverFeatures, f)
	}
	h.write(w, reg.Status, reg.StatusAcknowledge|reg.StatusDriver|reg.StatusFeaturesOK)
	h.read(w, reg.Status)
	for q := range 3 {
		h.write(w, reg.QueueSel, uint32(q))
		qmax := int(h.read(w, reg.QueueNumMax))
		n := 1 << h.rng.IntN(9) // 1 to 256
		if qmax > 0 && n > qmax {
			n = qmax
		}
		if h.rng.IntN(8) == 0 {
			n = h.rng.IntN(70000) // not a power of two, or past the maximum
		}
		h.write(w, reg.QueueNum, uint32(n))
		desc, avail, used := h.addr(16), h.addr(2), h.addr(4)
		if t := h.at(desc, 16*min(n, 256)); t != nil && n > 0 {
			h.descriptors(t, min(n, 256))
		}
		if a := h.at(avail, 4+2*min(n, 256)); a != nil {
			binary.LittleEndian.PutUint16(a, uint16(h.rng.IntN(2)))               // flags
			binary.LittleEndian.PutUint16(a[2:], uint16(h.rng.IntN(3*max(n, 1)))) // idx: may jump past the ring
			for i := 0; i < min(n, 256); i++ {
				binary.LittleEndian.PutUint16(a[4+2*i:], uint16(h.rng.IntN(max(n, 1)+4))) // heads, a few out of range
			}
		}
		for _, r := range []struct {
			low int
			a   uint64
		}{{reg.QueueDescLow, desc}, {reg.QueueDriverLow, avail}, {reg.QueueDeviceLow, used}} {
			h.write(w, r.low, uint32(r.a))
			h.write(w, r.low+4, uint32(r.a>>32))
		}
		h.write(w, reg.QueueReady, 1)
	}
	h.write(w, reg.Status, reg.StatusAcknowledge|reg.StatusDriver|reg.StatusFeaturesOK|reg.StatusDriverOK)
	for q := range 3 {
		h.write(w, reg.QueueNotify, uint32(q))
		h.notifies++
	}
	h.read(w, reg.Status)
}

// turn is one step: mostly a random register write, now and then a read,
// a re-scribbled scratch page or a whole bring-up.
func (h *hostile) turn() {
	w := h.rng.IntN(len(h.mmio))
	switch r := h.rng.IntN(256); {
	case r == 0:
		h.bringUp(w)
		return
	case r < 16:
		h.read(w, []int{reg.Status, reg.InterruptStatus, reg.QueueNumMax, reg.ConfigGeneration, reg.QueueReady}[r%5])
		return
	case r < 20:
		p := h.rng.IntN(scratchPages)
		for i := p * pageSize; i < (p+1)*pageSize; i += 8 {
			// Scribbled pages hold addresses too, never into the rest of RAM.
			binary.LittleEndian.PutUint64(h.scratch[i:], h.addr(1))
		}
		return
	}
	off := regs[h.rng.IntN(len(regs))]
	if off < 0 {
		off = h.rng.IntN(0x200/4) * 4 // the VMM's windows are 512 bytes
	}
	v := h.rng.Uint32()
	switch off {
	case reg.QueueNum:
		v &= 0x3ff
	case reg.QueueDescLow, reg.QueueDriverLow, reg.QueueDeviceLow:
		a := h.addr(16)
		v = uint32(a)
		h.write(w, off+4, uint32(a>>32))
	case reg.QueueDescHigh, reg.QueueDriverHigh, reg.QueueDeviceHigh:
		v = uint32(h.addr(16) >> 32)
	case reg.QueueNotify:
		v &= 3
		h.notifies++
	}
	h.write(w, off, v)
}
