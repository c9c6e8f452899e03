package client_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// stubSandbox returns a client of a stand-in daemon and a running sandbox
// of it.
func stubSandbox(t *testing.T) (*client.Client, string) {
	t.Helper()
	_, c := stubClient(t, "demo")
	ctx := context.Background()
	tpl, err := c.CreateTemplate(ctx, wire.TemplateRequest{Kernel: "vmlinux"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, wire.SandboxRequest{Template: tpl.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, sb.ID
}

// The process methods' round trips: start, list, get, follow with stdin,
// replay from an offset, signal, resize, wait, remove.
func TestProcessRoundTrip(t *testing.T) {
	c, id := stubSandbox(t)
	ctx := context.Background()
	p, err := c.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"cat"}, Stdin: true, Tag: "x"})
	if err != nil || p.ID == "" || !p.StdinOpen {
		t.Fatalf("start: %+v %v", p, err)
	}
	var out bytes.Buffer
	var start *wire.OutputStart
	var exit *int
	done := make(chan error, 1)
	go func() {
		done <- c.ProcessOutput(ctx, id, p.ID, -1, true, func(f wire.ExecFrame) error {
			if f.Start != nil {
				start = f.Start
			}
			out.Write(f.Stdout)
			exit = f.Exit
			return nil
		})
	}()
	if err := c.SendStdin(ctx, id, p.ID, strings.NewReader("hello "), false); err != nil {
		t.Fatal(err)
	}
	if err := c.SendStdin(ctx, id, p.ID, strings.NewReader("world"), true); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || start == nil || out.String() != "hello world" || exit == nil || *exit != 0 {
		t.Fatalf("follow: %v start %+v out %q exit %v", err, start, out.String(), exit)
	}
	var tail bytes.Buffer
	err = c.ProcessOutput(ctx, id, p.ID, 6, false, func(f wire.ExecFrame) error { tail.Write(f.Stdout); return nil })
	if err != nil || tail.String() != "world" {
		t.Fatalf("from offset 6: %q %v", tail.String(), err)
	}
	if l, err := c.Processes(ctx, id); err != nil || len(l) != 1 || l[0].ID != p.ID {
		t.Fatalf("processes: %+v %v", l, err)
	}

	sl, err := c.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"sleep", "1d"}, PTY: &wire.TerminalSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.ResizeProcess(ctx, id, sl.ID, wire.TerminalSize{Rows: 50, Cols: 132}); err != nil || r.PTY.Cols != 132 {
		t.Fatalf("resize: %+v %v", r, err)
	}
	waited := make(chan *wire.ProcessInfo, 1)
	go func() {
		w, _ := c.WaitProcess(ctx, id, sl.ID)
		waited <- w
	}()
	if _, err := c.SignalProcess(ctx, id, sl.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	if w := <-waited; w == nil || w.Exit == nil || w.Exit.Code != 143 || w.Exit.Signal != "TERM" {
		t.Fatalf("wait: %+v", w)
	}
	if err := c.RemoveProcess(ctx, id, sl.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Process(ctx, id, sl.ID); !client.IsNotFound(err) {
		t.Fatalf("a removed process: %v", err)
	}
	var ce *client.Error
	if _, err := c.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"no-such-program"}}); !errors.As(err, &ce) || ce.Code != "not_found" {
		t.Fatalf("a missing program: %v", err)
	}
}

// A followed stream that ends before the exit is ErrStreamEnded (the
// caller reconnects); an error line is the daemon's *Error; without
// follow, an end before the exit is the end.
func TestProcessOutputEnds(t *testing.T) {
	body := `{"start":{"offset":3}}` + "\n" + `{"stdout":"eA=="}` + "\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(body))
		if r.URL.Query().Get("follow") == "1" && strings.HasSuffix(r.URL.Path, "/p2/output") {
			w.Write([]byte(`{"error":"sandbox sb-1 was rolled back: reconnect"}` + "\n"))
		}
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "", "token")
	if err != nil {
		t.Fatal(err)
	}
	var got []wire.ExecFrame
	fn := func(f wire.ExecFrame) error { got = append(got, f); return nil }
	ctx := context.Background()
	if err := c.ProcessOutput(ctx, "sb-1", "p1", 3, true, fn); !errors.Is(err, client.ErrStreamEnded) {
		t.Fatalf("followed stream cut short: %v", err)
	}
	if len(got) != 2 || got[0].Start.Offset != 3 || string(got[1].Stdout) != "x" {
		t.Fatalf("frames %+v", got)
	}
	var ce *client.Error
	if err := c.ProcessOutput(ctx, "sb-1", "p2", 3, true, fn); !errors.As(err, &ce) || !strings.Contains(ce.Message, "rolled back") {
		t.Fatalf("error line: %v", err)
	}
	if err := c.ProcessOutput(ctx, "sb-1", "p1", 3, false, fn); err != nil {
		t.Fatalf("without follow: %v", err)
	}
}

// The file methods' round trips.
func TestFileRoundTrip(t *testing.T) {
	c, id := stubSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if fi, err := c.Mkdir(ctx, id, "/d/e", 0, true); err != nil || !fi.IsDir || fi.Path != "/d/e" {
		t.Fatalf("mkdir: %+v %v", fi, err)
	}
	if _, err := c.WriteFile(ctx, id, "/d/e/f", strings.NewReader("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.StatFile(ctx, id, "/d/e/f"); err != nil || fi.Size != 3 {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	l, err := c.ListFiles(ctx, id, "/d", 2)
	if err != nil || len(l) != 2 || l[0].Path != "/d/e" || l[1].Path != "/d/e/f" {
		t.Fatalf("list: %+v %v", l, err)
	}
	if fi, err := c.RenameFile(ctx, id, "/d/e/f", "/d/g"); err != nil || fi.Path != "/d/g" {
		t.Fatalf("rename: %+v %v", fi, err)
	}
	var events []string
	err = c.WatchFiles(ctx, id, "/d", true, func(ev wire.WatchEvent) bool {
		events = append(events, ev.Op+" "+ev.Path)
		return len(events) < 3
	})
	if err != nil || strings.Join(events, ",") != "ready /d,create /d/e,create /d/g" {
		t.Fatalf("watch: %q %v", events, err)
	}
	if err := c.RemoveFile(ctx, id, "/d", false); err == nil {
		t.Fatal("removed a non-empty directory without recursive")
	}
	if err := c.RemoveFile(ctx, id, "/d", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StatFile(ctx, id, "/d/g"); !client.IsNotFound(err) {
		t.Fatalf("stat after rm -r: %v", err)
	}
}
