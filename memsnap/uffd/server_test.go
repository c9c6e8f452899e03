package uffd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/memsnap"
)

const (
	testPages      = 1024 // 4 MiB of memory
	testChunkPages = 16
	ps             = 4096
)

// testChain writes a base layer and an incremental layer on it into dir,
// the incremental with pages rewritten, pages made non-zero that the base
// holds as zero, and pages cleared (zero runs), and opens the chain. It
// returns the chain and its effective memory (Chain.Restore's).
func testChain(t testing.TB, dir string, seed uint64) (*memsnap.Chain, []byte) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	mem := make([]byte, testPages*ps)
	fill := func(p int) {
		pg := mem[p*ps : (p+1)*ps]
		switch rng.IntN(3) {
		case 0:
			for i := range pg {
				pg[i] = byte(rng.Uint32())
			}
		default:
			for i := 0; i < len(pg); i += 8 {
				copy(pg[i:], fmt.Sprintf("p%05d ", p))
			}
		}
	}
	for p := range testPages {
		if rng.IntN(4) != 0 { // a quarter of the base stays zero
			fill(p)
		}
	}
	opts := memsnap.Options{Fingerprint: []byte("test"), ChunkPages: testChunkPages, Created: time.Unix(1700000000, 0)}
	base, err := memsnap.WriteBase(filepath.Join(dir, "base.wsnap"), bytes.NewReader(mem), uint64(len(mem)), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	dirty := make([]uint64, testPages/64)
	for range 300 {
		p := rng.IntN(testPages)
		dirty[p/64] |= 1 << (p % 64)
		if rng.IntN(3) == 0 {
			clear(mem[p*ps : (p+1)*ps]) // a zero run in the incremental layer
		} else {
			fill(p)
		}
	}
	incr, err := memsnap.WriteIncremental(filepath.Join(dir, "incr.wsnap"), bytes.NewReader(mem), uint64(len(mem)), dirty, base, opts)
	if err != nil {
		t.Fatal(err)
	}
	top := incr.Path()
	incr.Close()
	c, err := memsnap.OpenChain(top, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, len(mem))
	if err := c.Restore(want); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, mem) {
		t.Fatal("the chain does not restore what was written")
	}
	if st := c.Stats(); st[1].ZeroPages == 0 {
		t.Fatal("the incremental layer has no zero runs")
	}
	return c, want
}

// newMemfd returns a MAP_SHARED mapping of a new memfd of size bytes (all
// holes, as guestmem.New makes guest RAM) and the memfd; both go at
// cleanup.
func newMemfd(t testing.TB, size int) ([]byte, int) {
	t.Helper()
	fd, err := unix.MemfdCreate("uffd-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem); unix.Close(fd) })
	return mem, fd
}

// start starts a server on chain and mem, skipping the test where the
// host cannot; it closes the server at cleanup.
func start(t testing.TB, c *memsnap.Chain, mem []byte, o Options) *Server {
	t.Helper()
	s, err := Start(c, mem, o)
	if errors.Is(err, ErrUnsupported) {
		c.Close()
		t.Skipf("userfaultfd: %v", err)
	}
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// kernelReader reads guest pages the way KVM does: the kernel copies them
// (here into a scratch memfd, with pwrite), so a missing page is a
// kernel-mode fault, and the reading goroutine is in a system call while
// it waits (a user-mode read in runtime code would hold its P: see the
// package documentation).
type kernelReader struct {
	fd int
}

func newKernelReader(t testing.TB) *kernelReader {
	fd, err := unix.MemfdCreate("uffd-scratch", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &kernelReader{fd: fd}
}

// page returns a copy of page p of mem, read through the kernel; off
// places it in the scratch file (distinct per goroutine).
func (k *kernelReader) page(t testing.TB, mem []byte, p int, off int64) []byte {
	if _, err := unix.Pwrite(k.fd, mem[p*ps:(p+1)*ps], off); err != nil {
		t.Errorf("pwrite of page %d: %v", p, err)
		return nil
	}
	out := make([]byte, ps)
	if _, err := unix.Pread(k.fd, out, off); err != nil {
		t.Errorf("pread: %v", err)
	}
	return out
}

// readAll reads every page of mem in a random order on readers goroutines
// and checks each against want.
func readAll(t *testing.T, mem, want []byte, readers int, seed uint64) {
	t.Helper()
	k := newKernelReader(t)
	order := rand.New(rand.NewPCG(seed, 1)).Perm(testPages)
	var wg sync.WaitGroup
	for g := range readers {
		wg.Go(func() {
			for i := g; i < len(order); i += readers {
				p := order[i]
				if got := k.page(t, mem, p, int64(g)*ps); got != nil && !bytes.Equal(got, want[p*ps:(p+1)*ps]) {
					t.Errorf("page %d differs from Chain.Restore's", p)
					return
				}
			}
		})
	}
	wg.Wait()
}

// registered reports whether the mapping at mem is registered for missing
// faults (VmFlags "um" in /proc/self/smaps).
func registered(t *testing.T, mem []byte) bool {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("smaps: %v", err)
	}
	defer f.Close()
	start := fmt.Sprintf("%x-", uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		l := sc.Text()
		if f := strings.Fields(l); len(f) > 0 && !strings.HasSuffix(f[0], ":") {
			in = strings.HasPrefix(l, start) // a mapping's first line
		}
		if in && strings.HasPrefix(l, "VmFlags:") {
			return slices.Contains(strings.Fields(l)[1:], "um")
		}
	}
	t.Fatalf("no mapping at %s in smaps", start)
	return false
}

// TestServe: a base + incremental chain with zero runs, served to readers
// of a registered memfd mapping, with and without a prefetched working
// set, reads as Chain.Restore's memory; Complete then leaves identical
// memory, unregistered, with holes exactly where it is zero and untouched.
func TestServe(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefetch bool
		// wait lets the prefetcher finish before the readers start
		// (else they race it, and may fault every page first).
		wait bool
	}{{"demand", false, false}, {"prefetch", true, true}, {"prefetch racing readers", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			c, want := testChain(t, t.TempDir(), 1)
			mem, fd := newMemfd(t, len(want))
			var o Options
			if tc.prefetch {
				// Every fourth page from the top down: a working set that
				// is not in page order.
				for p := testPages - 1; p >= 0; p -= 4 {
					o.Prefetch = AppendPage(o.Prefetch, uint64(p))
				}
			}
			s := start(t, c, mem, o)
			if !registered(t, mem) {
				t.Fatal("the mapping is not registered for missing faults")
			}
			if tc.wait {
				<-s.PrefetchDone()
			}
			readAll(t, mem, want, 3, 2)
			<-s.PrefetchDone()
			st := s.Stats()
			t.Logf("%+v", st)
			if st.Faults == 0 || st.ChunksDecoded == 0 || st.BytesDecompressed == 0 || st.PagesCopied == 0 || st.ZeroPages == 0 || st.Errors != 0 {
				t.Errorf("stats %+v: want faults, decodes, copies, zero pages, no errors", st)
			}
			if tc.wait && st.Faults >= testPages/2 {
				t.Errorf("%d faults after prefetching every fourth page", st.Faults)
			}
			if tc.wait && st.PrefetchedPages == 0 {
				t.Error("nothing prefetched")
			}
			if !tc.prefetch && st.PrefetchedPages != 0 {
				t.Error("prefetched without a working set")
			}
			if err := s.Complete(); err != nil {
				t.Fatal(err)
			}
			if registered(t, mem) {
				t.Fatal("still registered after Complete")
			}
			if !bytes.Equal(mem, want) {
				t.Fatal("memory after Complete differs from Chain.Restore's")
			}
			if err := s.Complete(); err != nil {
				t.Fatalf("Complete again: %v", err)
			}
			if !s.Stats().Completed {
				t.Error("stats do not say completed")
			}
			_ = fd
		})
	}
}

// TestCompleteUntouched: Complete of memory nobody read installs every
// page that holds data, leaves the zero pages as holes, and unregisters.
func TestCompleteUntouched(t *testing.T) {
	c, want := testChain(t, t.TempDir(), 3)
	mem, fd := newMemfd(t, len(want))
	s := start(t, c, mem, Options{})
	if err := s.Complete(); err != nil {
		t.Fatal(err)
	}
	if registered(t, mem) {
		t.Fatal("still registered after Complete")
	}
	if !bytes.Equal(mem, want) {
		t.Fatal("memory after Complete differs from Chain.Restore's")
	}
	st := s.Stats()
	if st.Faults != 0 || st.CompletedPages == 0 || st.CompletedPages != st.PagesCopied {
		t.Errorf("stats %+v: want every page installed by Complete", st)
	}
	// Reading the zero pages above allocated them (a read of a shmem hole
	// maps the shared zero page or allocates): look at the pages Complete
	// installed instead, which are exactly the non-zero ones.
	zero := make([]byte, ps)
	var data uint64
	for p := range testPages {
		if !bytes.Equal(want[p*ps:(p+1)*ps], zero) {
			data++
		}
	}
	if st.CompletedPages < data {
		t.Errorf("Complete installed %d pages, %d hold data", st.CompletedPages, data)
	}
	_ = fd
}

// TestServeDiscarded: a page discarded after it was served (a balloon
// punching it out of the memfd) is served again from the chain.
func TestServeDiscarded(t *testing.T) {
	c, want := testChain(t, t.TempDir(), 4)
	mem, fd := newMemfd(t, len(want))
	s := start(t, c, mem, Options{})
	k := newKernelReader(t)
	p := 0
	for p = range testPages {
		if !bytes.Equal(want[p*ps:(p+1)*ps], make([]byte, ps)) {
			break
		}
	}
	if !bytes.Equal(k.page(t, mem, p, 0), want[p*ps:(p+1)*ps]) {
		t.Fatal("first read differs")
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(p*ps), ps); err != nil {
		t.Fatal(err)
	}
	before := s.Stats().Faults
	if !bytes.Equal(k.page(t, mem, p, 0), want[p*ps:(p+1)*ps]) {
		t.Fatal("the discarded page reads back different")
	}
	if s.Stats().Faults == before {
		t.Fatal("no fault for the discarded page")
	}
}

// TestWorkingSet: the pages served on demand are recorded in first-fault
// order; written and read back, the working set prefetches them into a
// second restore, whose reads of them then fault no more.
func TestWorkingSet(t *testing.T) {
	dir := t.TempDir()
	c, want := testChain(t, dir, 5)
	top := c.Top().Path()
	mem, _ := newMemfd(t, len(want))
	s := start(t, c, mem, Options{Record: true})
	k := newKernelReader(t)
	reads := []int{700, 3, 512, 100, 1000, 250, 3, 701}
	for _, p := range reads {
		if !bytes.Equal(k.page(t, mem, p, 0), want[p*ps:(p+1)*ps]) {
			t.Fatalf("page %d differs", p)
		}
	}
	ws := s.TakeWorkingSet()
	var got []uint64
	for p := range pagesOf(ws.Runs) {
		got = append(got, p)
	}
	if len(got) == 0 || got[0] != 700 {
		t.Fatalf("recorded %v, want 700 first", got)
	}
	// Recorded pages are the reads that faulted, in read order, once each.
	i := 0
	for _, p := range reads {
		if i < len(got) && got[i] == uint64(p) {
			i++
		}
	}
	if i != len(got) {
		t.Fatalf("recorded %v: not the reads %v in order", got, reads)
	}
	// Recording stopped: a new fault is not recorded.
	k.page(t, mem, 900, 0)
	if s.Stats().Recorded != len(got) || s.Stats().Recording {
		t.Fatalf("still recording: %+v", s.Stats())
	}
	path := filepath.Join(dir, "ws")
	if err := WriteWorkingSet(path, ws); err != nil {
		t.Fatal(err)
	}

	c2, err := memsnap.OpenChain(top, nil)
	if err != nil {
		t.Fatal(err)
	}
	rws, err := ReadWorkingSet(path, c2)
	if err != nil {
		c2.Close()
		t.Fatal(err)
	}
	if !slices.Equal(rws.Runs, ws.Runs) {
		t.Fatalf("read back %v, wrote %v", rws.Runs, ws.Runs)
	}
	mem2, _ := newMemfd(t, len(want))
	s2 := start(t, c2, mem2, Options{Prefetch: rws.Runs})
	select {
	case <-s2.PrefetchDone():
	case <-time.After(30 * time.Second):
		t.Fatal("prefetch did not finish")
	}
	st := s2.Stats()
	if st.PrefetchedPages < uint64(len(got)) || st.Errors != 0 {
		t.Fatalf("stats %+v: want at least %d prefetched pages", st, len(got))
	}
	for _, p := range got {
		if !bytes.Equal(k.page(t, mem2, int(p), 0), want[p*ps:(p+1)*ps]) {
			t.Fatalf("prefetched page %d differs", p)
		}
	}
	if f := s2.Stats().Faults; f != 0 {
		t.Errorf("%d faults reading prefetched pages", f)
	}
	readAll(t, mem2, want, 2, 6)

	// Another chain's working set is stale.
	other, _ := testChain(t, t.TempDir(), 9)
	defer other.Close()
	if _, err := ReadWorkingSet(path, other); !errors.Is(err, ErrStale) {
		t.Fatalf("working set of another chain: %v, want ErrStale", err)
	}
}

// TestCloseLeaksNothing: Close (with a prefetch under way, after faults,
// after Complete) leaves no goroutine or descriptor behind.
func TestCloseLeaksNothing(t *testing.T) {
	c0, want := testChain(t, t.TempDir(), 10)
	top := c0.Top().Path()
	c0.Close()
	countFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip(err)
		}
		return len(ents)
	}
	k := newKernelReader(t)
	for _, complete := range []bool{false, true} {
		c, err := memsnap.OpenChain(top, nil)
		if err != nil {
			t.Fatal(err)
		}
		mem, _ := newMemfd(t, len(want))
		fds, gs := countFDs(), runtime.NumGoroutine()
		s, err := Start(c, mem, Options{Prefetch: []Run{{First: 0, Count: testPages}}, Record: true})
		if errors.Is(err, ErrUnsupported) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		k.page(t, mem, 513, 0)
		if complete {
			if err := s.Complete(); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > gs && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > gs {
			t.Errorf("complete=%v: %d goroutines after Close, %d before Start", complete, n, gs)
		}
		// The chain's layer files are the server's and closed too.
		if n := countFDs(); n != fds-2 {
			t.Errorf("complete=%v: %d descriptors after Close, %d before Start with the chain's 2 layers", complete, n, fds)
		}
		if registered(t, mem) {
			t.Errorf("complete=%v: still registered after Close", complete)
		}
	}
}

// TestStartRefuses: memory of the wrong size is refused before anything
// is registered.
func TestStartRefuses(t *testing.T) {
	c, want := testChain(t, t.TempDir(), 11)
	defer c.Close()
	mem, _ := newMemfd(t, len(want)+ps)
	if _, err := Start(c, mem, Options{}); err == nil {
		t.Fatal("memory of another size was accepted")
	}
	if registered(t, mem) {
		t.Fatal("registered after a refusal")
	}
}

// TestDemandWaitsForPrefetchDecode: a demand fault on a chunk the
// prefetcher is decoding (outside the lock) waits for that decode instead
// of decoding the chunk a second time.
func TestDemandWaitsForPrefetchDecode(t *testing.T) {
	c, want := testChain(t, t.TempDir(), 11)
	pages := c.Pages()
	// Two visible pages of one chunk: the prefetcher's, and the fault's.
	var first, second uint64
	target := -1
	for p := uint64(0); p < pages.NumPages() && target < 0; p++ {
		chunk, ok := pages.Find(p)
		if !ok {
			continue
		}
		var vis []uint64
		for _, r := range pages.Runs(chunk) {
			for q := r.Page; q < r.Page+uint64(r.Count); q++ {
				vis = append(vis, q)
			}
		}
		if len(vis) >= 2 {
			target, first, second = chunk, vis[0], vis[len(vis)-1]
		}
	}
	if target < 0 {
		t.Fatal("no chunk with two visible pages")
	}
	started, release := make(chan struct{}), make(chan struct{})
	mem, _ := newMemfd(t, len(want))
	s := start(t, c, mem, Options{Prefetch: []Run{{First: first, Count: 1}}, beforeDecode: func(chunk int) {
		if chunk == target {
			close(started)
			<-release
		}
	}})
	<-started
	k := newKernelReader(t)
	got := make(chan []byte, 1)
	go func() { got <- k.page(t, mem, int(second), 0) }()
	deadline := time.Now().Add(30 * time.Second)
	for s.Stats().Faults == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the fault never reached the server")
		}
		time.Sleep(time.Millisecond)
	}
	// The demand is being served (under the lock, or waiting for the
	// prefetcher's decode): let the prefetcher decode.
	close(release)
	select {
	case b := <-got:
		if !bytes.Equal(b, want[second*ps:(second+1)*ps]) {
			t.Fatalf("page %d differs", second)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the faulting read never returned")
	}
	<-s.PrefetchDone()
	if !bytes.Equal(k.page(t, mem, int(first), 0), want[first*ps:(first+1)*ps]) {
		t.Fatalf("page %d differs", first)
	}
	if st := s.Stats(); st.ChunksDecoded != 1 || st.Errors != 0 {
		t.Fatalf("chunk %d decoded %d times (stats %+v), want once", target, st.ChunksDecoded, st)
	}
}
