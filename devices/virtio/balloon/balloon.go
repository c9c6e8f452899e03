// Package balloon is virtio-balloon (virtio 1.2, section 5.5): the
// guest's way of giving memory back to the host.
//
// The host sets a target (SetTarget: num_pages, in 4 KiB pages) and tells
// the driver with a configuration-change interrupt; the driver inflates
// the balloon towards it, handing the host the page frame numbers of pages
// it took from its allocator (inflate queue), which the device discards
// (guestmem.Memory.Discard: the host memory behind them is freed), and
// deflates it by taking pages back (deflate queue: counted only; a page
// comes back when the guest touches it). The driver reports how many pages
// it holds in the config's actual field. With VIRTIO_BALLOON_F_STATS_VQ
// the driver sends memory statistics, which the device keeps (the latest
// set, bounded) and asks for again every StatsInterval by returning the
// buffer it holds. With VIRTIO_BALLOON_F_FREE_PAGE_REPORTING the driver
// reports blocks of free memory (scatter lists of guest-physical ranges),
// which the device discards before returning the buffer: an idle guest's
// freed memory goes back to the host without any target.
// VIRTIO_BALLOON_F_DEFLATE_ON_OOM lets the driver deflate when the guest
// would otherwise run out of memory.
//
// Queues are numbered by what was negotiated: inflate 0, deflate 1, then
// stats when VIRTIO_BALLOON_F_STATS_VQ was, then reporting when
// VIRTIO_BALLOON_F_FREE_PAGE_REPORTING was (so the reporting queue is 2 or
// 3; the device never offers VIRTIO_BALLOON_F_FREE_PAGE_HINT, whose queue
// would come between). The transport has NumQueues queues; those without
// a role are ignored.
//
// Trust: every PFN, range and count comes from the guest. A PFN outside
// guest RAM, a PFN array that is not whole 32-bit entries or longer than
// maxPFNs, or a malformed ring is a driver fault (virtio.ErrBroken): the
// transport marks the device NEEDS_RESET. Reported ranges are checked by
// the queue (every buffer lies in guest RAM); statistics are bounded
// (MaxStats entries a set).
//
// Threads and ownership: one worker goroutine per activation owns every
// queue and touches them, guest memory (reads of PFN arrays and
// statistics, discards) and the interrupt only inside service passes
// (virtio.Activation.Enter/Leave), so MMIO.Quiesce finds it between
// requests. Every chain it pops is pushed before the pass ends except one:
// the statistics buffer, which the protocol has the device hold until it
// wants new statistics. The device records that buffer's head (held) in
// its saved state, and an activation keeps it only when the stats queue
// shows exactly one chain popped and not pushed (a restore); otherwise
// (after a driver reset) it is forgotten. Guest memory is the VM's
// (guestmem): the device discards only pages the guest gave it, through
// the Discarder. The host's calls (SetTarget, SetStatsInterval, Info) run
// on any goroutine; mu guards what they share with the worker and the
// transport's config accessors. Lock order: the transport's lock, then mu;
// the worker calls the configuration-change notifier with mu released.
package balloon

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/warrenvm/warren/devices/virtio"
)

// Type is the virtio device ID of a memory balloon.
const Type = 5

// Device-specific feature bits (virtio 1.2, 5.5.3).
const (
	FeatureStatsVQ           = 1 << 1
	FeatureDeflateOnOOM      = 1 << 2
	FeatureFreePageReporting = 1 << 5
)

// PageSize is the balloon's page: PFNs on the inflate and deflate queues
// count 4 KiB pages, whatever the guest's page size.
const PageSize = 4096

// NumQueues is how many queues the device has: inflate, deflate, stats
// and reporting (the last two used only when negotiated).
const NumQueues = 4

// MaxStats is the most statistics kept from one update (virtio 1.2 defines
// 10 tags, Linux 6.12 16); entries past it are ignored.
const MaxStats = 32

// MinStatsInterval is the shortest interval at which the device asks for
// statistics.
const MinStatsInterval = 100 * time.Millisecond

const (
	// queueSize is every queue's maximum size. Free page reporting needs
	// 32 descriptors a chain without indirect descriptors.
	queueSize = 128
	// maxPFNs bounds one inflate or deflate chain (Linux sends at most 256).
	maxPFNs = 1 << 16
	// statSize is one statistic: le16 tag, le64 value.
	statSize = 10
)

// Discarder frees the host memory behind guest pages:
// *guestmem.Memory is one.
type Discarder interface {
	// Discard frees the whole pages of guest [gpa, gpa+n).
	Discard(gpa, n uint64) error
	// DiscardSlice frees the whole pages of b, host bytes of guest RAM
	// as virtio.Memory's Slice returned them (a chain's buffer).
	DiscardSlice(b []byte) error
}

// Metrics are counters an operator reads. Those of type virtio.Counter
// survive save/restore (the device's state carries them); Errors and
// DiscardErrors do not.
type Metrics struct {
	// InflatedPages and DeflatedPages count the PFNs the driver put in
	// and took out of the balloon; InflateDiscardedPages the pages
	// discarded for inflation.
	InflatedPages         virtio.Counter `json:"inflated_pages"`
	DeflatedPages         virtio.Counter `json:"deflated_pages"`
	InflateDiscardedPages virtio.Counter `json:"inflate_discarded_pages"`
	// Reports counts free page reports; ReportedBytes the bytes they
	// named; ReportDiscardedBytes those discarded (whole pages).
	Reports              virtio.Counter `json:"reports"`
	ReportedBytes        virtio.Counter `json:"reported_bytes"`
	ReportDiscardedBytes virtio.Counter `json:"report_discarded_bytes"`
	// StatsUpdates counts statistics buffers received.
	StatsUpdates virtio.Counter `json:"stats_updates"`
	// Errors counts driver faults; DiscardErrors discards the host
	// refused (the pages then stay allocated).
	Errors        atomic.Uint64 `json:"-"`
	DiscardErrors atomic.Uint64 `json:"-"`
}

// Stat is one memory statistic of the guest.
type Stat struct {
	Tag   uint16 `json:"tag"`
	Value uint64 `json:"value"`
}

// Name is the statistic's name in virtio 1.2 (5.5.6.3) and Linux
// ("free-memory", ...), or "" for a tag this package does not know.
func (s Stat) Name() string {
	if int(s.Tag) < len(statNames) {
		return statNames[s.Tag]
	}
	return ""
}

// statNames are the names of the statistics tags, by tag.
var statNames = []string{
	"swap-in", "swap-out", "major-faults", "minor-faults", "free-memory",
	"total-memory", "available-memory", "disk-caches", "hugetlb-allocations",
	"hugetlb-failures", "oom-kills", "alloc-stalls", "async-scans",
	"direct-scans", "async-reclaims", "direct-reclaims",
}

// Info is the device's state as the host sees it.
type Info struct {
	// TargetPages is num_pages, the host's target; ActualPages the pages
	// the driver says the balloon holds.
	TargetPages, ActualPages uint32
	// StatsInterval is how often the device asks for statistics (0:
	// never; the driver's first set only).
	StatsInterval time.Duration
	// Stats is the latest set of statistics, in the driver's order, and
	// StatsTime when it came (zero: none yet).
	Stats     []Stat
	StatsTime time.Time
	// Active: the driver has set the device up (DRIVER_OK) and it runs;
	// Features are the features it negotiated then.
	Active   bool
	Features uint64
}

// Device is one virtio-balloon device.
type Device struct {
	// Metrics counts what the device did.
	Metrics Metrics
	// Discarder frees discarded pages. When nil, the activation's guest
	// memory is used if it is a Discarder (guestmem.Memory is); without
	// one, pages are checked and counted but not freed.
	Discarder Discarder

	workers virtio.Workers
	// wake tells the worker to look at a new target or interval
	// (buffered: one pending wake is enough).
	wake chan struct{}

	// mu guards the fields below.
	mu       sync.Mutex
	target   uint32
	actual   uint32
	interval time.Duration
	stats    []Stat
	statsAt  time.Time
	// held is the head of the statistics buffer the device holds (valid
	// when holding); see the package comment.
	held    uint16
	holding bool
	// active is set from Activate to Reset; features is what was
	// negotiated then.
	active   bool
	features uint64
	// tell: the target changed and the driver has not been told yet
	// (the worker tells it, inside a pass).
	tell bool
	// notify raises a configuration-change interrupt (the transport's
	// ConfigChanged); nil: none.
	notify func()
}

// New returns a balloon device with an empty target.
func New() *Device {
	return &Device{wake: make(chan struct{}, 1)}
}

// SetNotifier sets the function that tells the driver the configuration
// changed: the transport's ConfigChanged. The worker calls it inside a
// service pass, never while the transport is quiesced.
func (d *Device) SetNotifier(f func()) {
	d.mu.Lock()
	d.notify = f
	d.mu.Unlock()
}

// SetTarget sets the number of 4 KiB pages the host wants in the balloon
// and has the driver told (when it runs; a driver that starts later reads
// the target itself).
func (d *Device) SetTarget(pages uint32) {
	d.mu.Lock()
	d.target = pages
	if d.active {
		d.tell = true
	}
	d.mu.Unlock()
	d.poke()
}

// SetStatsInterval sets how often the device asks the driver for new
// statistics: 0 never (the driver's first set only), else at least
// MinStatsInterval.
func (d *Device) SetStatsInterval(iv time.Duration) error {
	if iv != 0 && iv < MinStatsInterval {
		return fmt.Errorf("virtio-balloon: statistics interval %v: want 0 or at least %v", iv, MinStatsInterval)
	}
	d.mu.Lock()
	d.interval = iv
	d.mu.Unlock()
	d.poke()
	return nil
}

// poke wakes the worker, if any, without blocking.
func (d *Device) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Info returns the device's state.
func (d *Device) Info() Info {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Info{TargetPages: d.target, ActualPages: d.actual, StatsInterval: d.interval,
		Stats: append([]Stat(nil), d.stats...), StatsTime: d.statsAt, Active: d.active, Features: d.features}
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return Type }

// Features implements virtio.Device.
func (d *Device) Features() uint64 {
	return FeatureStatsVQ | FeatureDeflateOnOOM | FeatureFreePageReporting |
		virtio.FeatureIndirectDesc | virtio.FeatureEventIdx
}

// QueueSizes implements virtio.Device: NumQueues queues.
func (d *Device) QueueSizes() []uint16 {
	return []uint16{queueSize, queueSize, queueSize, queueSize}
}

// configSize is the configuration space the device serves: num_pages and
// actual (le32 each). free_page_hint_cmd_id and poison_val belong to
// features it does not offer and read as zero.
const configSize = 8

// ReadConfig implements virtio.Device (called under the transport's lock).
func (d *Device) ReadConfig(off uint64, data []byte) {
	var cfg [configSize]byte
	d.mu.Lock()
	binary.LittleEndian.PutUint32(cfg[0:], d.target)
	binary.LittleEndian.PutUint32(cfg[4:], d.actual)
	d.mu.Unlock()
	if off < configSize {
		copy(data, cfg[off:])
	}
}

// WriteConfig implements virtio.Device: the driver writes actual (bytes
// 4-7); writes elsewhere are ignored.
func (d *Device) WriteConfig(off uint64, data []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var cfg [4]byte
	binary.LittleEndian.PutUint32(cfg[:], d.actual)
	for i, b := range data {
		if o := off + uint64(i); o >= 4 && o < configSize {
			cfg[o-4] = b
		}
	}
	d.actual = binary.LittleEndian.Uint32(cfg[:])
}

// roles are the queue indexes of each function (-1: not negotiated).
type roles struct{ inflate, deflate, stats, report int }

// queueRoles numbers the queues for the negotiated features.
func queueRoles(features uint64) roles {
	r := roles{inflate: 0, deflate: 1, stats: -1, report: -1}
	next := 2
	if features&FeatureStatsVQ != 0 {
		r.stats = next
		next++
	}
	if features&FeatureFreePageReporting != 0 {
		r.report = next
	}
	return r
}

// Activate implements virtio.Device: it checks that the queues of the
// negotiated functions are ready, settles the held statistics buffer (see
// the package comment) and starts the worker, which owns the queues until
// Reset.
func (d *Device) Activate(a *virtio.Activation) error {
	r := queueRoles(a.Features)
	for _, q := range []struct {
		name string
		i    int
	}{{"inflate", r.inflate}, {"deflate", r.deflate}, {"stats", r.stats}, {"reporting", r.report}} {
		if q.i >= 0 && (q.i >= len(a.Queues) || !a.Queues[q.i].Ready) {
			return fmt.Errorf("%w: virtio-balloon needs its %s queue (%d)", virtio.ErrBroken, q.name, q.i)
		}
	}
	disc := d.Discarder
	if disc == nil {
		disc, _ = a.Mem.(Discarder)
	}
	d.mu.Lock()
	if r.stats >= 0 {
		q := a.Queues[r.stats]
		switch out := q.NextAvail - q.NextUsed; {
		case out == 0:
			d.holding = false // a driver reset forgot it
		case out == 1 && d.holding && d.held < q.Size:
		default:
			d.mu.Unlock()
			return fmt.Errorf("%w: virtio-balloon stats queue has %d buffers out, the device holds %v", virtio.ErrBroken, out, d.holding)
		}
	} else {
		d.holding = false
	}
	d.active, d.features, d.tell = true, a.Features, false
	d.mu.Unlock()
	return d.workers.Start(func(stop <-chan struct{}) { d.run(a, r, disc, stop) })
}

// Reset implements virtio.Device: it stops the worker. The held
// statistics buffer is settled by the next Activate.
func (d *Device) Reset() {
	d.workers.Stop()
	d.mu.Lock()
	d.active, d.tell = false, false
	d.mu.Unlock()
}

// run is the worker of one activation: a service pass over every queue on
// each kick, statistics tick or host change, until stop.
func (d *Device) run(a *virtio.Activation, r roles, disc Discarder, stop <-chan struct{}) {
	kicks := func(i int) <-chan struct{} {
		if i < 0 {
			return nil
		}
		return a.Kicks[i]
	}
	var (
		ticker   *time.Ticker
		tick     <-chan time.Time
		interval time.Duration
		due      bool
	)
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for {
		d.mu.Lock()
		iv := d.interval
		d.mu.Unlock()
		if iv != interval {
			if ticker != nil {
				ticker.Stop()
				ticker, tick = nil, nil
			}
			if interval = iv; iv > 0 && r.stats >= 0 {
				ticker = time.NewTicker(iv)
				tick = ticker.C
			}
		}
		if !a.Enter(stop) {
			return
		}
		err := d.pass(a, r, disc, &due)
		if err != nil {
			d.Metrics.Errors.Add(1)
			a.Broken(err)
		}
		a.Leave()
		if err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-kicks(r.inflate):
		case <-kicks(r.deflate):
		case <-kicks(r.stats):
		case <-kicks(r.report):
		case <-tick:
			due = true
		case <-d.wake:
		}
	}
}

// pass is one service pass: it tells the driver of a new target, serves
// the inflate, deflate and reporting queues, takes new statistics, and
// returns the statistics buffer when *due. It stops early, at a safe
// point, when the transport is quiescing (Resume kicks every queue).
func (d *Device) pass(a *virtio.Activation, r roles, disc Discarder, due *bool) error {
	d.mu.Lock()
	tell, notify := d.tell, d.notify
	d.tell = false
	d.mu.Unlock()
	if tell && notify != nil {
		notify()
	}
	serve := []struct {
		i int
		f func(*virtio.Chain) error
	}{
		{r.inflate, func(c *virtio.Chain) error { return d.inflate(a.Mem, disc, c) }},
		{r.deflate, d.deflate},
		{r.report, func(c *virtio.Chain) error { return d.report(disc, c) }},
	}
	for _, s := range serve {
		if s.i < 0 {
			continue
		}
		if err := drain(a, a.Queues[s.i], s.f); err != nil {
			return err
		}
	}
	if r.stats < 0 || a.Quiescing() {
		return nil
	}
	return d.serveStats(a, a.Queues[r.stats], due)
}

// drain serves q's available chains one at a time, pushing each (no bytes
// written) before popping the next, until the ring is empty or the
// transport quiesces, and interrupts the driver if it asks.
func drain(a *virtio.Activation, q *virtio.Queue, serve func(*virtio.Chain) error) error {
	for !a.Quiescing() {
		c, err := q.Pop(a.Mem)
		if err != nil {
			return err
		}
		if c == nil {
			break
		}
		if err := serve(c); err != nil {
			return err
		}
		if err := q.Push(a.Mem, c.Head, 0); err != nil {
			return err
		}
	}
	return a.InterruptIfNeeded(q)
}

// pfns decodes a chain's readable buffers as an array of le32 PFNs (an
// entry may straddle two buffers).
func pfns(c *virtio.Chain) ([]uint32, error) {
	n := c.ReadableLen()
	if n%4 != 0 {
		return nil, fmt.Errorf("%w: virtio-balloon PFN array of %d bytes", virtio.ErrBroken, n)
	}
	if n/4 > maxPFNs {
		return nil, fmt.Errorf("%w: virtio-balloon PFN array of %d entries, more than %d", virtio.ErrBroken, n/4, maxPFNs)
	}
	out := make([]uint32, 0, n/4)
	var e [4]byte
	k := 0
	for _, b := range c.Readable {
		for _, x := range b {
			e[k] = x
			if k++; k == 4 {
				out = append(out, binary.LittleEndian.Uint32(e[:]))
				k = 0
			}
		}
	}
	return out, nil
}

// pageRun is a run of n pages from guest address gpa.
type pageRun struct{ gpa, n uint64 }

// inflate serves an inflate chain: every PFN must be a page of guest RAM
// (checked for all before any is discarded); runs of consecutive PFNs are
// discarded together.
func (d *Device) inflate(mem virtio.Memory, disc Discarder, c *virtio.Chain) error {
	list, err := pfns(c)
	if err != nil {
		return err
	}
	var runs []pageRun
	for _, p := range list {
		gpa := uint64(p) * PageSize
		if k := len(runs); k > 0 && runs[k-1].gpa+runs[k-1].n*PageSize == gpa {
			runs[k-1].n++
			continue
		}
		runs = append(runs, pageRun{gpa, 1})
	}
	for _, r := range runs {
		if _, err := mem.Slice(r.gpa, r.n*PageSize); err != nil {
			return fmt.Errorf("%w: virtio-balloon inflate: pages [%#x, +%d) are not guest RAM", virtio.ErrBroken, r.gpa, r.n)
		}
	}
	d.Metrics.InflatedPages.Add(uint64(len(list)))
	if disc == nil {
		return nil
	}
	for _, r := range runs {
		if err := disc.Discard(r.gpa, r.n*PageSize); err != nil {
			d.Metrics.DiscardErrors.Add(1)
			continue
		}
		d.Metrics.InflateDiscardedPages.Add(r.n)
	}
	return nil
}

// deflate serves a deflate chain: the pages come back to the guest when
// it touches them, so they are only counted.
func (d *Device) deflate(c *virtio.Chain) error {
	list, err := pfns(c)
	if err != nil {
		return err
	}
	d.Metrics.DeflatedPages.Add(uint64(len(list)))
	return nil
}

// report serves a free page report: every buffer of the chain (device-
// writable, as Linux sends them, or readable) is a range of free guest
// memory, already checked to lie in RAM; its whole pages are discarded.
func (d *Device) report(disc Discarder, c *virtio.Chain) error {
	d.Metrics.Reports.Add(1)
	for _, bufs := range [][][]byte{c.Readable, c.Writable} {
		for _, b := range bufs {
			d.Metrics.ReportedBytes.Add(uint64(len(b)))
			if disc == nil {
				continue
			}
			if err := disc.DiscardSlice(b); err != nil {
				d.Metrics.DiscardErrors.Add(1)
				continue
			}
			d.Metrics.ReportDiscardedBytes.Add(wholePages(b))
		}
	}
	return nil
}

// wholePages is how many bytes of b's whole pages a discard frees, by the
// host addresses of b (guest pages are host pages at the same offsets).
func wholePages(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	start := uint64(uintptrOf(b))
	lo := (start + PageSize - 1) &^ (PageSize - 1)
	hi := (start + uint64(len(b))) &^ (PageSize - 1)
	if hi <= lo {
		return 0
	}
	return hi - lo
}

// serveStats takes the statistics buffers the driver made available
// (normally one, after each request): the newest set is kept and its
// buffer held, an older held one is returned first. When *due it returns
// the held buffer, which asks the driver for a new set.
func (d *Device) serveStats(a *virtio.Activation, q *virtio.Queue, due *bool) error {
	for !a.Quiescing() {
		c, err := q.Pop(a.Mem)
		if err != nil {
			return err
		}
		if c == nil {
			break
		}
		d.mu.Lock()
		old, had := d.held, d.holding
		d.held, d.holding = c.Head, true
		d.stats, d.statsAt = parseStats(c.Readable), time.Now()
		d.mu.Unlock()
		d.Metrics.StatsUpdates.Add(1)
		if had {
			if err := q.Push(a.Mem, old, 0); err != nil {
				return err
			}
		}
	}
	if *due && !a.Quiescing() {
		d.mu.Lock()
		head, had := d.held, d.holding
		d.holding = false
		d.mu.Unlock()
		if had {
			if err := q.Push(a.Mem, head, 0); err != nil {
				return err
			}
		}
		*due = false
	}
	return a.InterruptIfNeeded(q)
}

// parseStats decodes up to MaxStats statistics (le16 tag, le64 value,
// packed) from the buffers; a trailing partial entry is ignored. A tag
// given twice keeps its last value, in its first place.
func parseStats(bufs [][]byte) []Stat {
	var raw []byte
	for _, b := range bufs {
		if room := MaxStats*statSize - len(raw); room > 0 {
			raw = append(raw, b[:min(len(b), room)]...)
		}
	}
	var out []Stat
next:
	for i := 0; i+statSize <= len(raw); i += statSize {
		s := Stat{Tag: binary.LittleEndian.Uint16(raw[i:]), Value: binary.LittleEndian.Uint64(raw[i+2:])}
		for j := range out {
			if out[j].Tag == s.Tag {
				out[j].Value = s.Value
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// uintptrOf is the host address of b's first byte (b not empty).
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
