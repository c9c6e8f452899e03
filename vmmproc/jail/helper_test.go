//go:build linux && amd64

package jail

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startHelper serves handle on a new helper pair and returns the
// requester's end.
func startHelper(t *testing.T, handle HelperFunc) *os.File {
	t.Helper()
	ours, theirs, err := helperPair()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		ServeHelper(ours, handle)
		close(done)
	}()
	t.Cleanup(func() {
		theirs.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("ServeHelper did not return once its peer was gone")
		}
		ours.Close()
	})
	return theirs
}

// TestHelperHandsOverFiles: a request gets the handler's reply and its
// descriptors, working ones, from many callers at once, and the handler
// learns the sender's pid from the kernel; a refusal comes back as an
// error naming why.
func TestHelperHandsOverFiles(t *testing.T) {
	conn := startHelper(t, func(req []byte, in []*os.File, pid int) ([]byte, []*os.File, error) {
		if pid != os.Getpid() { // the sender, as the kernel says
			return nil, nil, fmt.Errorf("the request came from pid %d, want %d", pid, os.Getpid())
		}
		if string(req) == "no" {
			return nil, nil, errors.New("not allowed")
		}
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		defer w.Close()
		fmt.Fprintf(w, "pipe for %s", req)
		for _, f := range in { // the caller's descriptors came along
			b, _ := io.ReadAll(f)
			req = append(append(req, '+'), b...)
		}
		return append([]byte("re:"), req...), []*os.File{r}, nil
	})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := fmt.Sprintf("call-%d", i)
			var in []*os.File
			if i%2 == 1 { // half of them pass a pipe along
				r, w, err := os.Pipe()
				if err != nil {
					t.Error(err)
					return
				}
				defer r.Close()
				fmt.Fprintf(w, "in-%d", i)
				w.Close()
				in = []*os.File{r}
			}
			rep, files, err := CallHelper(conn, []byte(req), in, 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer closeAll(files)
			if in != nil {
				req += fmt.Sprintf("+in-%d", i)
			}
			if string(rep) != "re:"+req || len(files) != 1 {
				t.Errorf("%s: reply %q with %d files", req, rep, len(files))
				return
			}
			b, _ := io.ReadAll(files[0])
			if want, _, _ := strings.Cut("pipe for "+req, "+"); string(b) != want {
				t.Errorf("%s: the handed-over pipe holds %q", req, b)
			}
		}()
	}
	wg.Wait()
	if _, _, err := CallHelper(conn, []byte("no"), nil, 5*time.Second); err == nil || !strings.Contains(err.Error(), "not allowed") {
		t.Errorf("a refused request: %v, want the handler's error", err)
	}
	if _, _, err := CallHelper(conn, make([]byte, MaxHelperRequest+1), nil, time.Second); err == nil {
		t.Error("an oversized request was sent")
	}
	if _, _, err := CallHelper(conn, []byte("many"), make([]*os.File, MaxHelperRequestFiles+1), time.Second); err == nil {
		t.Error("a request with too many descriptors was sent")
	}
}

// TestHelperDropsMalformed: messages a hostile VMM might send (no reply
// socket, too many descriptors, an oversized payload) are dropped, their
// descriptors closed, and the helper goes on serving.
func TestHelperDropsMalformed(t *testing.T) {
	calls := 0
	var mu sync.Mutex
	conn := startHelper(t, func(req []byte, _ []*os.File, _ int) ([]byte, []*os.File, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return req, nil, nil
	})
	fd := int(conn.Fd())
	if err := unix.Sendmsg(fd, []byte("no socket"), nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	r, w, _ := os.Pipe()
	defer r.Close()
	many := make([]int, 2+MaxHelperRequestFiles)
	for i := range many {
		many[i] = int(r.Fd())
	}
	if err := unix.Sendmsg(fd, []byte("many"), unix.UnixRights(many...), nil, 0); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, MaxHelperRequest+100)
	if err := unix.Sendmsg(fd, big, unix.UnixRights(int(r.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	rep, _, err := CallHelper(conn, []byte("after"), nil, 5*time.Second)
	if err != nil || string(rep) != "after" {
		t.Fatalf("after malformed messages: %q, %v", rep, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Errorf("the handler ran %d times, want once (malformed messages reach it)", calls)
	}
	// The helper closed its copies of the descriptors it dropped: with
	// ours closed too, the pipe's writer sees no reader.
	r.Close()
	w.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("a dropped message's descriptor is still open in the helper")
	}
	w.Close()
}

// TestHelperFromEnv refuses a variable naming anything but a helper socket.
func TestHelperFromEnv(t *testing.T) {
	t.Setenv(HelperEnv, "")
	if f, err := HelperFromEnv(); f != nil || err != nil {
		t.Errorf("unset: %v, %v", f, err)
	}
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	t.Setenv(HelperEnv, fmt.Sprint(r.Fd()))
	if _, err := HelperFromEnv(); err == nil {
		t.Error("a pipe was taken for the helper socket")
	}
	t.Setenv(HelperEnv, "x")
	if _, err := HelperFromEnv(); err == nil {
		t.Error("a non-number was taken for a descriptor")
	}
	ours, theirs, err := helperPair()
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close()
	defer theirs.Close()
	dup, err := unix.Dup(int(theirs.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(HelperEnv, fmt.Sprint(dup)) // f below owns dup
	f, err := HelperFromEnv()
	if err != nil || f == nil {
		t.Fatalf("a helper socket: %v", err)
	}
	f.Close()
}
