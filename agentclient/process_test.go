package agentclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentclient/agentstub"
	"github.com/warrenvm/warren/agentwire"
)

// TestHostileAgentProcesses is TestHostileAgent for the process and file
// calls of process.go: an endless reply fails each call quickly, bounded
// in size (one-record replies at 64 KiB, lists at Limits.Reply, each
// output frame at agentwire.MaxFrame, each watch line at 64 KiB).
func TestHostileAgentProcesses(t *testing.T) {
	stub := agentstub.Start(t, agentstub.Endless)
	c := NewLimits(stub.Path, Limits{Reply: 1 << 20, ReplyTimeout: 3 * time.Second})
	defer c.Close()
	for _, tc := range []struct {
		name     string
		call     func(ctx context.Context) error
		tooLarge bool // the error wraps ErrReplyTooLarge
	}{
		{"start", func(ctx context.Context) error {
			_, err := c.StartProcess(ctx, agentwire.ProcessRequest{Argv: []string{"true"}})
			return err
		}, true},
		{"processes", func(ctx context.Context) error { _, err := c.Processes(ctx); return err }, true},
		{"process", func(ctx context.Context) error { _, err := c.Process(ctx, "a-1"); return err }, true},
		{"signal", func(ctx context.Context) error { _, err := c.SignalProcess(ctx, "a-1", "TERM"); return err }, true},
		{"resize", func(ctx context.Context) error {
			_, err := c.ResizeProcess(ctx, "a-1", agentwire.TerminalSize{Rows: 1, Cols: 1})
			return err
		}, true},
		{"wait", func(ctx context.Context) error { _, err := c.WaitProcess(ctx, "a-1"); return err }, true},
		{"list-depth", func(ctx context.Context) error { _, err := c.ListDepth(ctx, "/", 3); return err }, true},
		{"mkdir", func(ctx context.Context) error { _, err := c.Mkdir(ctx, "/x", 0o755, true); return err }, true},
		{"rename", func(ctx context.Context) error { _, err := c.Rename(ctx, "/x", "/y"); return err }, true},
		{"watch", func(ctx context.Context) error {
			return c.Watch(ctx, "/", true, func(agentwire.WatchEvent) bool { return true })
		}, true},
		{"output", func(ctx context.Context) error {
			return c.ProcessOutput(ctx, "a-1", 0, true, func(byte, []byte) error { return nil })
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errc := make(chan error, 1)
			go func() { errc <- tc.call(context.Background()) }()
			select {
			case err := <-errc:
				if err == nil || (tc.tooLarge && !errors.Is(err, ErrReplyTooLarge)) {
					t.Fatalf("err = %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the call still reads the guest's endless reply after 30s")
			}
		})
	}
}
