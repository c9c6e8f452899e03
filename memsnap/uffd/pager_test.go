package uffd

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/vmm/guestmem"
)

// The Server is the pager of the guest memory it serves.
var (
	_ guestmem.Pager     = (*Server)(nil)
	_ guestmem.Forgetter = (*Server)(nil)
)

// pagedMemory returns guest memory of the test chain's size served by a
// Server with no handler goroutine (nothing serves a fault: an access
// that faulted would hang) set as its pager, and the chain's memory. The
// server is closed before the memory at cleanup, which wakes any thread
// left waiting in a fault.
func pagedMemory(t *testing.T, o Options) (*guestmem.Memory, *Server, []byte) {
	t.Helper()
	c, want := testChain(t, t.TempDir(), 9)
	mem, err := guestmem.New(uint64(len(want)))
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	o.noHandler = true
	s := start(t, c, mem.Flat(), o)
	mem.SetPager(s)
	return mem, s, want
}

// within runs f on a goroutine and fails the test if it has not returned
// after d: f touching a page not installed would wait forever, with no
// handler to serve it. f reports by its error, not through t (it may
// outlive the test).
func within(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(d):
		t.Fatalf("%s: still waiting after %v: it faulted on a page Ensure did not install", what, d)
	}
}

// TestEnsureWithoutHandler reads and writes every page through guestmem's
// accessors, with no handler to serve a fault: Ensure installs each page
// before it is touched, as the chain holds it, recorded in the working
// set, and a page installed costs no second install.
func TestEnsureWithoutHandler(t *testing.T) {
	mem, s, want := pagedMemory(t, Options{Record: true})
	within(t, 20*time.Second, "reading every page", func() error {
		buf := make([]byte, ps)
		for p := range testPages {
			if _, err := mem.ReadAt(buf, int64(p*ps)); err != nil {
				return err
			}
			if !bytes.Equal(buf, want[p*ps:(p+1)*ps]) {
				return fmt.Errorf("page %d differs from Chain.Restore's", p)
			}
		}
		return nil
	})
	st := s.Stats()
	if st.Faults != 0 || st.EnsuredPages == 0 || st.EnsuredPages > testPages || st.Errors != 0 {
		t.Fatalf("stats %+v: want ensured pages, no faults, no errors", st)
	}
	if st.PagesCopied+st.ZeroPages != testPages {
		t.Errorf("%d pages copied and %d zero, want %d in all", st.PagesCopied, st.ZeroPages, testPages)
	}
	if st.Recorded != int(st.EnsuredPages) {
		t.Errorf("%d pages recorded, %d ensured", st.Recorded, st.EnsuredPages)
	}
	within(t, 20*time.Second, "slicing and writing again", func() error {
		b, err := mem.Slice(3*ps-7, 2*ps)
		if err != nil {
			return err
		}
		if !bytes.Equal(b, want[3*ps-7:5*ps-7]) {
			return errors.New("a slice across pages differs")
		}
		_, err = mem.WriteAt([]byte("written"), 100*ps-3)
		return err
	})
	if after := s.Stats(); after.EnsuredPages != st.EnsuredPages || after.PagesCopied != st.PagesCopied {
		t.Errorf("installed pages again: %+v after %+v", after, st)
	}
	if err := s.Ensure(uint64(testPages*ps)-ps, 2*ps); err == nil {
		t.Error("Ensure past the end succeeded")
	}
}

// TestEnsureFresh touches pages no read went near first (a slice across
// chunks, a write into a zero window), each the first access to its
// chunk, from several goroutines at once.
func TestEnsureFresh(t *testing.T) {
	mem, s, want := pagedMemory(t, Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Go(func() {
			gpa := uint64(g*250+testChunkPages/2) * ps
			b, err := mem.Slice(gpa, 3*testChunkPages*ps)
			if err == nil && !bytes.Equal(b, want[gpa:gpa+3*testChunkPages*ps]) {
				err = fmt.Errorf("the slice at page %d differs", gpa/ps)
			}
			errs <- err
		})
	}
	within(t, 20*time.Second, "slicing on 4 goroutines", func() error {
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	})
	if st := s.Stats(); st.Faults != 0 || st.EnsuredPages == 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestForgetReinstalls discards a page through guestmem (punching it out
// of the memfd, missing again for userfaultfd): Discard's Forget clears
// its bit, and the next access has Ensure install it again, as the chain
// holds it; without a handler, a stale bit would hang the read.
func TestForgetReinstalls(t *testing.T) {
	mem, s, want := pagedMemory(t, Options{})
	p := 0
	for p = 1; p < testPages; p++ {
		if !bytes.Equal(want[p*ps:(p+1)*ps], make([]byte, ps)) {
			break
		}
	}
	buf := make([]byte, ps)
	read := func() error {
		if _, err := mem.ReadAt(buf, int64(p*ps)); err != nil {
			return err
		}
		if !bytes.Equal(buf, want[p*ps:(p+1)*ps]) {
			return fmt.Errorf("page %d differs", p)
		}
		return nil
	}
	within(t, 20*time.Second, "the first reads", func() error {
		_, err := mem.ReadAt(make([]byte, 3*ps), int64((p-1)*ps))
		return err
	})
	for q := p - 1; q <= p+1; q++ {
		if !s.isPopulated(uint64(q)) {
			t.Fatalf("page %d, read, is not marked populated", q)
		}
	}
	before := s.Stats()
	if err := mem.Discard(uint64(p*ps), ps); err != nil {
		t.Fatal(err)
	}
	if s.isPopulated(uint64(p)) {
		t.Fatal("the discarded page is still marked populated")
	}
	if !s.isPopulated(uint64(p-1)) || !s.isPopulated(uint64(p+1)) {
		t.Error("Forget cleared a neighbour")
	}
	within(t, 20*time.Second, "the read after the discard", read)
	after := s.Stats()
	if after.EnsuredPages != before.EnsuredPages+1 || after.PagesCopied <= before.PagesCopied || after.Faults != 0 {
		t.Errorf("stats %+v after %+v: want one more page ensured and copied, no fault", after, before)
	}
	// Once closed, the memory is an ordinary memfd: Ensure and Forget
	// answer at once.
	s.Close()
	s.Forget(0, uint64(testPages*ps))
	if err := s.Ensure(0, uint64(testPages*ps)); err != nil {
		t.Errorf("Ensure after Close: %v", err)
	}
	if got := s.Stats().EnsuredPages; got != after.EnsuredPages {
		t.Errorf("Ensure after Close installed %d pages", got-after.EnsuredPages)
	}
}

// BenchmarkEnsurePopulated is the cost Ensure adds to every device access
// once its pages are installed: one atomic load per page.
func BenchmarkEnsurePopulated(b *testing.B) {
	c, _ := testChain(b, b.TempDir(), 9)
	mem, _ := newMemfd(b, testPages*ps)
	s := start(b, c, mem, Options{})
	if err := s.Ensure(0, testPages*ps); err != nil {
		b.Fatal(err)
	}
	for _, n := range []uint64{16, 64 << 10} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for i := range b.N {
				if err := s.Ensure(uint64(i%512)*ps, n); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
