//go:build linux

package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warrenvm/warren/agentwire"
)

const (
	fOut = agentwire.FrameStdout
	fErr = agentwire.FrameStderr
)

// kept returns the buffer's chunks as "typ:data" strings.
func kept(b *outputBuffer) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var l []string
	for _, c := range b.chunks {
		l = append(l, string('0'+c.typ)+":"+string(c.data))
	}
	return l
}

func TestOutputBufferWrite(t *testing.T) {
	type write struct {
		typ  byte
		data string
	}
	for _, tc := range []struct {
		name      string
		max       int
		maxChunks int
		writes    []write
		want      []string
		from, end int64
	}{
		{"coalesced", 100, 10, []write{{fOut, "ab"}, {fOut, "cd"}, {fErr, "ef"}, {fOut, "g"}}, []string{"1:abcd", "2:ef", "1:g"}, 0, 7},
		{"oldest dropped", 5, 10, []write{{fOut, "abc"}, {fErr, "def"}, {fOut, "gh"}}, []string{"2:def", "1:gh"}, 3, 8},
		{"within a chunk", 4, 10, []write{{fOut, "abcdef"}}, []string{"1:cdef"}, 2, 6},
		{"chunk bound", 100, 2, []write{{fOut, "a"}, {fErr, "b"}, {fOut, "c"}}, []string{"2:b", "1:c"}, 1, 3},
		{"empty write", 100, 2, []write{{fOut, ""}}, nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newOutputBuffer(tc.max)
			b.maxChunks = tc.maxChunks
			for _, w := range tc.writes {
				b.write(w.typ, []byte(w.data))
			}
			if got := kept(b); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("kept %q, want %q", got, tc.want)
			}
			if from, end := b.bounds(); from != tc.from || end != tc.end {
				t.Errorf("bounds %d %d, want %d %d", from, end, tc.from, tc.end)
			}
		})
	}
}

func TestOutputBufferNext(t *testing.T) {
	b := newOutputBuffer(6)
	b.write(fOut, []byte("abc"))
	b.write(fErr, []byte("def"))
	b.write(fOut, []byte("gh")) // "ab" dropped: kept "c" "def" "gh" from 2
	buf := make([]byte, 2)
	for _, tc := range []struct {
		name       string
		pos, limit int64
		typ        byte
		at         int64
		data       string
	}{
		{"dropped", 0, 100, fOut, 2, "c"},
		{"start of a chunk", 3, 100, fErr, 3, "de"}, // len(dst) bounds it
		{"middle", 4, 100, fErr, 4, "ef"},
		{"limit", 4, 5, fErr, 4, "e"},
		{"at the limit", 5, 5, 0, 0, ""},
		{"at the end", 8, 100, 0, 0, ""},
		{"past the end", 9, 100, 0, 0, ""},
	} {
		rd := b.next(tc.pos, tc.limit, buf)
		if rd.typ != tc.typ || rd.at != tc.at || string(buf[:rd.n]) != tc.data || rd.end != 8 || rd.closed {
			t.Errorf("%s: next(%d, %d) = %+v %q", tc.name, tc.pos, tc.limit, rd, buf[:rd.n])
		}
	}
	rd := b.next(8, 100, buf)
	b.write(fOut, []byte("i"))
	select {
	case <-rd.wake:
	default:
		t.Fatal("write did not wake")
	}
	rd = b.next(9, 100, buf)
	b.close()
	<-rd.wake
	if rd = b.next(9, 100, buf); !rd.closed || rd.n != 0 {
		t.Fatalf("after close: %+v", rd)
	}
	b.write(fOut, []byte("j")) // dropped after close
	if _, end := b.bounds(); end != 9 {
		t.Fatalf("end %d after a write after close", end)
	}
}

// stallWriter is a response writer that runs stall at its first write of
// a frame of output (the reader is slow), once.
type stallWriter struct {
	*httptest.ResponseRecorder
	frames int
	stall  func()
}

func (w *stallWriter) Write(p []byte) (int, error) {
	// Frames are written as a header then a payload: the 2nd frame's
	// header is the first output frame's.
	if w.frames++; w.frames == 3 && w.stall != nil {
		w.stall()
		w.stall = nil
	}
	return w.ResponseRecorder.Write(p)
}

func TestStreamOutputSlowReader(t *testing.T) {
	p := &process{info: agentwire.ProcessInfo{ID: "x-1"}, out: newOutputBuffer(8), done: make(chan struct{})}
	p.out.write(fOut, []byte("abcd"))
	p.out.write(fErr, []byte("efgh"))
	// While the reader is stuck writing "abcd", 12 more bytes come: it
	// goes on at the oldest kept byte, told so by another OutputStart.
	w := &stallWriter{ResponseRecorder: httptest.NewRecorder(), stall: func() {
		p.out.write(fOut, []byte("ijklmnop"))
		p.out.write(fErr, []byte("qrst"))
		p.mu.Lock()
		p.exit = &agentwire.ExitStatus{Code: 5}
		p.mu.Unlock()
		p.out.close()
	}}
	streamOutput(w, httptest.NewRequest("GET", "/processes/x-1/output?offset=0", nil), p)
	var got []string
	r := bufio.NewReader(w.Body)
	for {
		typ, payload, err := agentwire.ReadFrame(r, nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case agentwire.FrameOutputStart:
			var st agentwire.OutputStart
			if err := json.Unmarshal(payload, &st); err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprintf("start:%d/%d", st.Offset, st.Dropped))
		case agentwire.FrameExit:
			var st agentwire.ExitStatus
			if err := json.Unmarshal(payload, &st); err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprintf("exit:%d", st.Code))
		default:
			got = append(got, string('0'+typ)+":"+string(payload))
		}
	}
	// Kept after the stall: "mnop" (from 12) and "qrst".
	want := []string{"start:0/0", "1:abcd", "start:12/8", "1:mnop", "2:qrst", "exit:5"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("frames %q, want %q", got, want)
	}
}
