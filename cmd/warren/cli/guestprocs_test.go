package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/term"

	"github.com/warrenvm/warren/hostd/client/clienttest"
	"github.com/warrenvm/warren/hostd/wire"
)

// stubSandbox starts a stand-in daemon with one sandbox, "box", and
// returns the daemon and the sandbox's id.
func stubSandbox(t *testing.T) (*clienttest.Stub, string) {
	t.Helper()
	stub := stubDaemon(t)
	expect(t, 0, "", "templates", "create", "--kernel", "vmlinux")
	sb, _ := expect(t, 0, "", "create", "--name", "box")
	return stub, strings.TrimSpace(sb)
}

// The process verbs against a stand-in daemon: exec -d, -i, -t and
// --user, ps, logs, wait, signal, attach.
func TestProcessVerbs(t *testing.T) {
	stub, sb := stubSandbox(t)
	run := func(want int, stdin string, args ...string) (string, string) {
		t.Helper()
		return expect(t, want, stdin, args...)
	}
	// exec -d prints the process's id; its output waits in the guest.
	out, _ := run(0, "", "exec", "-d", "--user", "nobody", "box", "--", "exit", "7")
	pid := strings.TrimSpace(out)
	if pid == "" || strings.Contains(pid, "\n") {
		t.Fatalf("exec -d printed %q", out)
	}
	if p, ok := stub.Process(sb, pid); !ok || p.User != "nobody" || p.PTY != nil || p.StdinOpen {
		t.Fatalf("the process started: %+v %v", p, ok)
	}
	if out, _ := run(0, "", "logs", "box", pid); out != "exit 7\n" {
		t.Errorf("logs: %q", out)
	}
	if out, _ := run(0, "", "logs", "--offset", "5", "box", pid); out != "7\n" {
		t.Errorf("logs --offset 5: %q", out)
	}
	if out, _ := run(0, "", "logs", "-f", "box", pid); out != "exit 7\n" {
		t.Errorf("logs -f of an exited process: %q", out)
	}
	run(7, "", "wait", "box", pid)
	if out, _ := run(7, "", "wait", "--json", "box", pid); !strings.Contains(out, `"code": 7`) {
		t.Errorf("wait --json: %q", out)
	}

	// A background process that runs until signalled.
	out, _ = run(0, "", "exec", "-d", sb, "--", "sleep", "1d")
	sleeper := strings.TrimSpace(out)
	ps, _ := run(0, "", "ps", "box")
	lines := strings.Split(strings.TrimSpace(ps), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "COMMAND") ||
		!strings.Contains(lines[1], pid) || !strings.Contains(lines[1], "exited") || !strings.Contains(lines[1], "exit 7") ||
		!strings.Contains(lines[2], "running") || !strings.Contains(lines[2], "sleep 1d") {
		t.Errorf("ps:\n%s", ps)
	}
	var l []wire.ProcessInfo
	if out, _ := run(0, "", "ps", "--json", "box"); json.Unmarshal([]byte(out), &l) != nil || len(l) != 2 {
		t.Errorf("ps --json: %q", out)
	}
	if out, _ := run(0, "", "signal", "box", sleeper, "TERM"); out != sleeper+" exited\n" {
		t.Errorf("signal: %q", out)
	}
	run(143, "", "wait", "box", sleeper)
	if ps, _ := run(0, "", "ps", "box"); !strings.Contains(ps, "143 (TERM)") {
		t.Errorf("ps after a signal:\n%s", ps)
	}
	run(1, "", "signal", "box", sleeper, "NOSUCH")
	run(1, "", "wait", "box", "nope")
	run(1, "", "logs", "box", "nope")
	run(2, "", "wait", "box")

	// exec -i through the process API (--user): stdin forwarded, the
	// output followed, the exit code the process's.
	if out, _ := run(0, "hello\n", "exec", "-i", "--user", "1000", "box", "--", "cat"); out != "hello\n" {
		t.Errorf("exec -i --user: %q", out)
	}
	// exec -t: on a terminal (here stdin is no terminal: 24x80).
	if out, _ := run(0, "ls\n\x04", "exec", "-t", "box", "--", "sh"); out != "ls\n" {
		t.Errorf("exec -t: %q", out)
	}
	l = nil
	out, _ = run(0, "", "ps", "--json", "box")
	json.Unmarshal([]byte(out), &l)
	if last := l[len(l)-1]; last.PTY == nil || last.PTY.Rows != 24 || last.PTY.Cols != 80 {
		t.Errorf("exec -t's process: %+v", last)
	}
	run(127, "", "exec", "-d", "box", "--", "no-such-program")
	run(125, "", "exec", "-d", "nobox", "--", "true")

	// exec -d -i sends stdin before it detaches; attach replays it.
	out, _ = run(0, "typed\n", "exec", "-d", "-i", "box", "--", "cat")
	catPID := strings.TrimSpace(out)
	if out, _ := run(0, "", "attach", "--from-start", "box", catPID); out != "typed\n" {
		t.Errorf("attach --from-start: %q", out)
	}
	// attach from now on: only what comes next.
	out, _ = run(0, "", "exec", "-d", "-t", "box", "--", "sh")
	shPID := strings.TrimSpace(out)
	if out, _ := run(0, "after\n\x04", "attach", "box", shPID); out != "after\n" {
		t.Errorf("attach: %q", out)
	}
}

// The file verbs against a stand-in daemon.
func TestFileVerbs(t *testing.T) {
	_, sb := stubSandbox(t)
	run := func(want int, stdin string, args ...string) (string, string) {
		t.Helper()
		return expect(t, want, stdin, args...)
	}
	run(0, "", "files", "mkdir", "-p", "box", "/srv/app")
	run(1, "", "files", "mkdir", "box", "/srv/app")
	run(2, "", "files", "mkdir", "-m", "99", "box", "/x")
	run(0, "data", "cp", "-", "box:/srv/app/f")
	if out, _ := run(0, "", "files", "ls", "-d", "3", "box", "/srv"); !strings.Contains(out, "/srv/app\n") || !strings.Contains(out, " 4 ") || !strings.Contains(out, "/srv/app/f\n") {
		t.Errorf("files ls -d 3:\n%s", out)
	}
	if out, _ := run(0, "", "files", "ls", sb, "/srv"); strings.Contains(out, "/srv/app/f") {
		t.Errorf("files ls (depth 1):\n%s", out)
	}
	if out, _ := run(0, "", "files", "stat", "box", "/srv/app/f"); !strings.Contains(out, "size:     4\n") || !strings.Contains(out, "type:     file\n") {
		t.Errorf("files stat:\n%s", out)
	}
	run(0, "", "files", "mv", "box", "/srv/app/f", "/srv/app/g")
	run(1, "", "files", "stat", "box", "/srv/app/f")
	if out, errOut := run(0, "", "files", "watch", "-r", "--count", "1", "box", "/srv"); !strings.Contains(out, "create") || !strings.Contains(out, "/srv/app") || !strings.Contains(errOut, "watching /srv") {
		t.Errorf("files watch: %q %q", out, errOut)
	}
	if out, _ := run(0, "", "files", "watch", "--json", "--count", "1", "box", "/srv"); strings.Count(out, "\n") != 2 || !strings.Contains(out, `"op":"ready"`) {
		t.Errorf("files watch --json: %q", out)
	}
	run(1, "", "files", "rm", "box", "/srv")
	run(0, "", "files", "rm", "-r", "box", "/srv")
	run(1, "", "files", "stat", "box", "/srv/app/g")
	run(2, "", "files", "bogus", "box", "/")
	run(2, "", "files", "stat", "box")
}

// A followed stream that breaks (the sandbox rolled back, the daemon
// restarted) is followed again from the offset reached: logs -f and a
// session print every byte once.
func TestFollowReconnects(t *testing.T) {
	var mu sync.Mutex
	var offsets []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		offsets = append(offsets, r.URL.Query().Get("offset"))
		n := len(offsets)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		switch n {
		case 1: // from the oldest kept (offset 2), then cut short
			fmt.Fprintln(w, `{"start":{"offset":2,"dropped":2}}`)
			fmt.Fprintln(w, `{"stdout":"b25lCg=="}`) // one\n
		case 2: // the daemon's error line
			fmt.Fprintln(w, `{"start":{"offset":6}}`)
			fmt.Fprintln(w, `{"stderr":"dHdvCg=="}`) // two\n
			fmt.Fprintln(w, `{"error":"sandbox sb-0123456789ab was rolled back: reconnect"}`)
		default:
			fmt.Fprintln(w, `{"start":{"offset":10}}`)
			fmt.Fprintln(w, `{"stdout":"dGhyZWUK"}`) // three\n
			fmt.Fprintln(w, `{"exit":0}`)
		}
	}))
	defer srv.Close()
	t.Setenv("WARREN_HOST", srv.URL)
	t.Setenv("WARREN_TOKEN", "token")
	out, errOut := expect(t, 0, "", "logs", "-f", "sb-0123456789ab", "p1")
	if out != "one\nthree\n" || !strings.Contains(errOut, "two\n") || !strings.Contains(errOut, "2 bytes of output before offset 2") {
		t.Errorf("logs -f: %q %q", out, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(offsets, ",") != ",6,10" {
		t.Errorf("the reconnects asked for offsets %q, want \"\", 6, 10", offsets)
	}
}

// exec -t on a real terminal: its size goes to the process, the terminal
// goes raw (keystrokes pass as they are typed, Ctrl-D included) and comes
// back as it was; Ctrl-] detaches and leaves the process running.
func TestExecTerminal(t *testing.T) {
	stub, sb := stubSandbox(t)
	// session runs exec -t on a new terminal (a stale session's reader
	// of the last one must not take its keys), types keys once the
	// terminal is raw, and returns the exit code, output and whether the
	// terminal was restored.
	session := func(keys string, resize bool) (int, string, string, bool) {
		t.Helper()
		ptm, tty, err := pty.Open()
		if err != nil {
			t.Skipf("no pseudo-terminal: %v", err)
		}
		defer ptm.Close()
		defer tty.Close()
		if err := pty.Setsize(ptm, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
			t.Fatal(err)
		}
		before, err := term.GetState(int(tty.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		done := make(chan int, 1)
		go func() { done <- Main([]string{"exec", "-t", "box", "--", "sh"}, tty, &out, &errOut) }()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, _ := term.GetState(int(tty.Fd()))
			if st != nil && !reflect.DeepEqual(st, before) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the terminal never went raw")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if resize {
			// The local terminal resized: SIGWINCH, and the process's
			// follows.
			pty.Setsize(ptm, &pty.Winsize{Rows: 50, Cols: 132})
			syscall.Kill(os.Getpid(), syscall.SIGWINCH)
			for {
				l := processes(t, stub, sb)
				if p := l[len(l)-1]; p.PTY != nil && p.PTY.Rows == 50 && p.PTY.Cols == 132 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the process's terminal was not resized: %+v", l[len(l)-1])
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		ptm.Write([]byte(keys))
		select {
		case code := <-done:
			st, _ := term.GetState(int(tty.Fd()))
			return code, out.String(), errOut.String(), reflect.DeepEqual(st, before)
		case <-time.After(10 * time.Second):
			t.Fatal("the session did not end")
		}
		return 0, "", "", false
	}
	// Ctrl-C is a byte to the process; Ctrl-D ends the stub's shell.
	// (Its size is the local terminal's.)
	code, out, errOut, restored := session("ab\x03c\x04", false)
	if code != 0 || out != "ab\x03c" || !restored {
		t.Fatalf("session: exit %d, out %q, err %q, terminal restored %v", code, out, errOut, restored)
	}
	l := processes(t, stub, sb)
	if p := l[len(l)-1]; p.PTY == nil || p.PTY.Rows != 40 || p.PTY.Cols != 120 || p.State != "exited" {
		t.Fatalf("the session's process: %+v", p)
	}
	code, _, errOut, restored = session("x\x1d", true)
	l = processes(t, stub, sb)
	if p := l[len(l)-1]; code != 0 || !strings.Contains(errOut, "detached") || p.State != "running" || !restored {
		t.Fatalf("detach: exit %d %q, process %+v, terminal restored %v", code, errOut, p, restored)
	}
}

// processes returns sandbox sb's processes as the stub has them.
func processes(t *testing.T, stub *clienttest.Stub, sb string) []wire.ProcessInfo {
	t.Helper()
	out, _ := expect(t, 0, "", "ps", "--json", sb)
	var l []wire.ProcessInfo
	if err := json.Unmarshal([]byte(out), &l); err != nil || len(l) == 0 {
		t.Fatalf("ps --json: %q %v", out, err)
	}
	for i, p := range l {
		if q, ok := stub.Process(sb, p.ID); ok {
			l[i] = q
		}
	}
	return l
}
