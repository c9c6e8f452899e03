package daemon

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentclient/agentstub"
)

// TestHostileGuestAgent: tenant "evil"'s guest agent answers every
// request with an endless JSON body. Its requests through the daemon
// (a file download stats the file first, an upload reads the agent's
// FileInfo) must fail quickly with a 502 naming the size limit, the
// daemon's memory must not grow with what the guest streams, and tenant
// "good" must be served all the while.
func TestHostileGuestAgent(t *testing.T) {
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t))
	evil, good := td.client(t, "evil"), td.client(t, "good")
	bad := evil.create(evil.template(fakeKernel(t)).ID)
	fine := good.create(good.template(fakeKernel(t)).ID)

	stub := agentstub.Start(t, agentstub.Endless)
	s := td.sandbox("evil", bad.ID)
	s.mu.Lock()
	s.agent = agentclient.New(stub.Path) // the daemon's own limits
	s.mu.Unlock()

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	var wg sync.WaitGroup
	type result struct {
		what string
		st   int
		body string
		err  error
		took time.Duration
	}
	results := make(chan result, 16)
	for i := 0; i < 4; i++ {
		for _, r := range []struct{ method, path string }{
			{"GET", "/v1/sandboxes/" + bad.ID + "/files?path=/etc/hostname"},
			{"PUT", "/v1/sandboxes/" + bad.ID + "/files?path=/tmp/x"},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				var body any
				if r.method == "PUT" {
					body = []byte("x")
				}
				st, b, err := evil.try(r.method, r.path, body)
				results <- result{r.method + " " + r.path, st, string(b), err, time.Since(start)}
			}()
		}
	}
	// Tenant good is served while evil's requests are under way.
	for i := 0; i < 3; i++ {
		if out, _, code := good.exec(fine.ID, "echo", "still here"); code != 0 || out != "still here\n" {
			t.Fatalf("good's exec: %q, exit %d", out, code)
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("evil's requests still read the guest's endless replies after 60s (the stub sent %d MiB)", stub.Sent()>>20)
	}
	close(results)
	for r := range results {
		if r.err != nil || r.st != 502 || !strings.Contains(r.body, "too large") {
			t.Errorf("%s: %d %q %v; want 502 naming the limit", r.what, r.st, r.body, r.err)
		}
		if r.took > 30*time.Second {
			t.Errorf("%s: took %v", r.what, r.took)
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 64<<20 {
		t.Errorf("the daemon's heap grew by %d MiB", grew>>20)
	}
	if out, _, code := good.exec(fine.ID, "echo", "after"); code != 0 || out != "after\n" {
		t.Fatalf("good's exec after: %q, exit %d", out, code)
	}
}
