package daemon

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRestoreGateFIFO: slots are taken up to the limit, waiters get them
// in arrival order with their places reported, and a waiter whose context
// ends leaves the queue without taking or losing a slot.
func TestRestoreGateFIFO(t *testing.T) {
	g := newRestoreGate(2)
	ctx := context.Background()
	for range 2 {
		if err := g.acquire(ctx, func(int, int) { t.Error("reported a place with a slot free") }); err != nil {
			t.Fatal(err)
		}
	}
	var order []int
	var mu sync.Mutex
	places := make([]chan int, 3)
	done := make([]chan struct{}, 3)
	cctx, cancel := context.WithCancel(ctx)
	for i := range 3 {
		places[i], done[i] = make(chan int, 100), make(chan struct{})
		c := ctx
		if i == 1 {
			c = cctx // the middle waiter gives up
		}
		go func() {
			defer close(done[i])
			if err := g.acquire(c, func(p, _ int) { places[i] <- p }); err != nil {
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}()
		if p := <-places[i]; p != i+1 {
			t.Fatalf("waiter %d reported place %d, want %d", i, p, i+1)
		}
	}
	if busy, waiting := g.stats(); busy != 2 || waiting != 3 {
		t.Fatalf("busy %d, waiting %d; want 2, 3", busy, waiting)
	}
	cancel()
	<-done[1]
	if _, waiting := g.stats(); waiting != 2 {
		t.Fatalf("%d waiting after one gave up, want 2", waiting)
	}
	g.release()
	<-done[0]
	g.release()
	<-done[2]
	mu.Lock()
	if len(order) != 2 || order[0] != 0 || order[1] != 2 {
		t.Errorf("slots went to %v, want [0 2]", order)
	}
	mu.Unlock()
	g.release()
	g.release()
	if busy, waiting := g.stats(); busy != 0 || waiting != 0 {
		t.Errorf("busy %d, waiting %d at the end", busy, waiting)
	}
}

// TestRestoreGateCancelAfterHandover: a waiter whose context ends just as
// the slot is handed to it passes the slot on instead of leaking it.
func TestRestoreGateCancelAfterHandover(t *testing.T) {
	for range 200 {
		g := newRestoreGate(1)
		g.acquire(context.Background(), nil)
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error)
		go func() { got <- g.acquire(ctx, nil) }()
		for _, w := g.stats(); w == 0; _, w = g.stats() {
			time.Sleep(time.Microsecond)
		}
		go cancel()
		g.release()
		if err := <-got; err == nil {
			g.release()
		}
		if busy, waiting := g.stats(); busy != 0 || waiting != 0 {
			t.Fatalf("busy %d, waiting %d after the race", busy, waiting)
		}
	}
}

// TestCreatesQueueForRestoreSlots: with one restore slot, concurrent
// creates all succeed, never more than one restore runs at a time, and
// the queued ones say their place in their progress.
func TestCreatesQueueForRestoreSlots(t *testing.T) {
	var active, peak atomic.Int32
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t), func(c *Config) {
		c.MaxRestores = 1
		c.Hooks.BeforeRestore = func(_, path string) (string, func(), error) {
			if n := active.Add(1); n > peak.Load() {
				peak.Store(n)
			}
			time.Sleep(300 * time.Millisecond) // a restore that takes a while
			return path, func() { active.Add(-1) }, nil
		}
	})
	c := td.client(t, "alice")
	tp := c.template(fakeKernel(t))
	c.create(tp.ID) // the template's first restore (which the others wait for outside the queue)
	const n = 4
	var wg sync.WaitGroup
	queued := make(chan string, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, b := c.do("POST", "/v1/sandboxes", map[string]any{"template": tp.ID}, "Accept", "application/x-ndjson")
			if st != 200 || !strings.Contains(string(b), `"status":201`) {
				t.Errorf("create: %d %s", st, b)
			}
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, "queued for a restore slot") {
					queued <- l
					break
				}
			}
		}()
	}
	wg.Wait()
	close(queued)
	if p := peak.Load(); p != 1 {
		t.Errorf("%d restores ran at once, want 1", p)
	}
	var lines []string
	for l := range queued {
		lines = append(lines, l)
	}
	if len(lines) < n-1 {
		t.Errorf("%d creates reported a place in the queue, want at least %d: %q", len(lines), n-1, lines)
	}
	for _, l := range lines {
		if !strings.Contains(l, " waiting (1 restores at a time)") {
			t.Errorf("queue progress %q", l)
		}
	}
}
