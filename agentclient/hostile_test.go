package agentclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentclient/agentstub"
	"github.com/warrenvm/warren/agentwire"
)

// TestHostileAgent is a guest agent that answers every request with an
// endless JSON value (or an endless file, or a reply trickled a byte a
// second): each call must fail quickly with a clear error and the host's
// memory must not grow with what the guest sends.
func TestHostileAgent(t *testing.T) {
	stub := agentstub.Start(t, agentstub.Endless)
	c := NewLimits(stub.Path, Limits{Reply: 1 << 20, File: 8 << 20, ReplyTimeout: 3 * time.Second})
	defer c.Close()

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"health", func(ctx context.Context) error { _, err := c.Health(ctx); return err }},
		{"stat", func(ctx context.Context) error { _, err := c.Stat(ctx, "/etc/hosts"); return err }},
		{"list", func(ctx context.Context) error { _, err := c.List(ctx, "/"); return err }},
		{"services", func(ctx context.Context) error { _, err := c.Services(ctx); return err }},
		{"service", func(ctx context.Context) error { _, err := c.Service(ctx, "x"); return err }},
		{"start-service", func(ctx context.Context) error {
			_, err := c.StartService(ctx, agentwire.ServiceSpec{Name: "x", Argv: []string{"true"}})
			return err
		}},
		{"stop-service", func(ctx context.Context) error { _, err := c.StopService(ctx, "x"); return err }},
		{"write-file", func(ctx context.Context) error {
			_, err := c.WriteFile(ctx, "/tmp/x", strings.NewReader("hi"), 0o644)
			return err
		}},
		{"read-file", func(ctx context.Context) error { _, err := c.ReadFile(ctx, "/dev/zero", io.Discard); return err }},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			// No deadline of the caller's: the client's own limits end it.
			start := time.Now()
			errc := make(chan error, 1)
			go func() { errc <- tc.call(context.Background()) }()
			select {
			case err := <-errc:
				if !errors.Is(err, ErrReplyTooLarge) {
					t.Fatalf("err = %v, want ErrReplyTooLarge", err)
				}
				t.Logf("%v after %v", err, time.Since(start).Round(time.Millisecond))
			case <-time.After(30 * time.Second):
				t.Fatal("the call still reads the guest's endless reply after 30s")
			}
		})
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 32<<20 {
		t.Errorf("heap grew by %d MiB reading hostile replies", grew>>20)
	}
	if stub.Sent() < 8<<20 {
		t.Errorf("the stub sent only %d bytes: the test did not stress the client", stub.Sent())
	}
}

// TestTricklingAgent is a guest agent that sends its replies a byte at a
// time and never ends them: calls without a deadline of their own end at
// the client's ReplyTimeout.
func TestTricklingAgent(t *testing.T) {
	stub := agentstub.Start(t, agentstub.Trickle)
	c := NewLimits(stub.Path, Limits{ReplyTimeout: 2 * time.Second})
	defer c.Close()
	for name, call := range map[string]func() error{
		"health": func() error { _, err := c.Health(context.Background()); return err },
		"stat":   func() error { _, err := c.Stat(context.Background(), "/"); return err },
		"write": func() error {
			_, err := c.WriteFile(context.Background(), "/tmp/x", bytes.NewReader([]byte("x")), 0o600)
			return err
		},
	} {
		start := time.Now()
		err := call()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: err = %v, want a deadline", name, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s: took %v, want about 2s", name, d)
		}
	}
}

// TestHonestAgentWithinLimits checks that replies within the limits
// still work through the same stub machinery.
func TestHonestAgentWithinLimits(t *testing.T) {
	stub := agentstub.StartHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			io.WriteString(w, `{"ok":true}`+"\n")
		case "/files":
			w.Header().Set(agentwire.ModeHeader, "644")
			w.Write(bytes.Repeat([]byte("a"), 1000))
		default:
			http.NotFound(w, r)
		}
	}))
	c := NewLimits(stub.Path, Limits{Reply: 64, File: 1000})
	defer c.Close()
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := c.ReadFile(context.Background(), "/f", &b); err != nil || b.Len() != 1000 {
		t.Fatalf("ReadFile = %d bytes, %v; want 1000 bytes of a file at the limit", b.Len(), err)
	}
}
