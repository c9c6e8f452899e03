package daemon

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentclient/agentstub"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/wire"
)

// hostileProcessAgent is a guest agent that answers the process and file
// API with what a hostile guest might send: endless JSON, frames of
// unknown types or over the frame bound, bad payloads, endless lines.
func hostileProcessAgent(w http.ResponseWriter, r *http.Request) {
	endless := func() {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`[{"id":"`))
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}
	frames := func(fs ...[]byte) {
		w.Header().Set("Content-Type", "application/octet-stream")
		for _, f := range fs {
			w.Write(f)
		}
	}
	frame := func(typ byte, payload string) []byte {
		var b bytes.Buffer
		agentwire.WriteFrame(&b, typ, []byte(payload))
		return b.Bytes()
	}
	switch {
	case r.URL.Path == "/processes", strings.HasSuffix(r.URL.Path, "/wait"), r.URL.Path == "/list":
		endless()
	case strings.HasSuffix(r.URL.Path, "/unknown-type/output"):
		frames(frame(agentwire.FrameOutputStart, `{"offset":0}`), frame(agentwire.FrameStdout, "hi"), frame(42, "?"))
	case strings.HasSuffix(r.URL.Path, "/too-big/output"):
		frames(frame(agentwire.FrameOutputStart, `{"offset":0}`), []byte{agentwire.FrameStdout, 0xff, 0xff, 0xff, 0xff})
	case strings.HasSuffix(r.URL.Path, "/bad-start/output"):
		frames(frame(agentwire.FrameOutputStart, `{"offset":"x"`))
	case strings.HasSuffix(r.URL.Path, "/bad-exit/output"):
		frames(frame(agentwire.FrameOutputStart, `{"offset":0}`), frame(agentwire.FrameExit, `[]`))
	case r.URL.Path == "/watch":
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(`{"op":"ready","path":"/"}` + "\n"))
		chunk := bytes.Repeat([]byte("b"), 64<<10)
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	default:
		http.Error(w, "no", http.StatusNotFound)
	}
}

// A hostile guest's answers to the process and file API end in a 502 (or,
// once a stream has started, its error line), quickly, and never as a
// frame of theirs passed on.
func TestHostileGuestProcesses(t *testing.T) {
	td, _, c := aliceDaemon(t)
	sb := c.create(c.template(fakeKernel(t)).ID)
	stub := agentstub.StartHandler(t, http.HandlerFunc(hostileProcessAgent))
	s := td.sandbox("alice", sb.ID)
	s.mu.Lock()
	s.agent = agentclient.New(stub.Path) // the daemon's own limits
	s.mu.Unlock()
	base := "/v1/sandboxes/" + sb.ID
	for _, path := range []string{base + "/processes", base + "/files/list?path=/&depth=3"} {
		start := time.Now()
		if st, b := c.do("GET", path, nil); st != 502 || !strings.Contains(string(b), "too large") {
			t.Errorf("GET %s: %d %.200s, want 502 naming the limit", path, st, b)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("GET %s took %v", path, d)
		}
	}
	if st, b := c.do("GET", base+"/processes/x/wait", nil); st != 502 {
		t.Errorf("wait: %d %.200s, want 502", st, b)
	}
	for pid, want := range map[string]string{"unknown-type": "frame type 42", "too-big": "exceeds", "bad-exit": "bad exit frame"} {
		st, b := c.do("GET", base+"/processes/"+pid+"/output", nil)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		var last wire.ExecFrame
		json.Unmarshal([]byte(lines[len(lines)-1]), &last)
		if st != 200 || !strings.Contains(last.Error, want) || last.Exit != nil {
			t.Errorf("output of %s: %d %q, want a last error line with %q", pid, st, b, want)
		}
	}
	if st, b := c.do("GET", base+"/processes/bad-start/output", nil); st != 502 || !strings.Contains(string(b), "bad output start") {
		t.Errorf("output with a bad start frame: %d %s, want 502", st, b)
	}
	st, b := c.do("GET", base+"/files/watch?path=/", nil)
	sc := bufio.NewScanner(bytes.NewReader(b))
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if st != 200 || len(lines) != 2 || !strings.Contains(lines[0], `"ready"`) || !strings.Contains(lines[1], `"error"`) {
		t.Errorf("watch with an endless line: %d %q", st, lines)
	}
}
