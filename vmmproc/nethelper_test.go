package vmmproc

import (
	"os"
	"strings"
	"testing"
)

// TestNetHelperRefuses: what a subverted VMM might ask its jail-init's
// helper for, beyond a private network with a tap of a plain name, or a
// fork child under a grant where jail-init starts them, is refused before
// anything is made.
func TestNetHelperRefuses(t *testing.T) {
	const devNet = 1 << 20 // never reached: each request is refused first
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, c := range []struct {
		req, want string
		devNet    int
		in        []*os.File
	}{
		{`{"net": {"tap": "../../etc"}}`, "tap name", devNet, nil},
		{`{"net": {"tap": "averyveryverylongname"}}`, "tap name", devNet, nil},
		{`{"net": {"tap": ""}}`, "tap name", devNet, nil},
		{`{"net": {"tap": "wt0", "netns": "/proc/1/ns/net"}}`, "unknown field", devNet, nil},
		{`{"net": {"tap": "wt0", "private": false}}`, "unknown field", devNet, nil},
		{`{"net": {"tap": "wt0"}}`, "carries no descriptors", devNet, []*os.File{r}},
		{`{"net": {"tap": "wt0"}}`, "makes no networks", -1, nil},
		{`{"spawn": {"grant": "x"}}`, "starts no fork children", devNet, []*os.File{w}},
		{`{"spawn": {"grant": "x"}, "net": {"tap": "wt0"}}`, "exactly one", devNet, nil},
		{`{"exec": "/bin/sh"}`, "unknown field", devNet, nil},
		{`{}`, "exactly one", devNet, nil},
		{`not json`, "bad request", devNet, nil},
	} {
		h := &familyHelper{devNet: c.devNet, limit: newNetRateLimit()}
		out, files, err := h.serve([]byte(c.req), c.in, os.Getpid())
		if err == nil || !strings.Contains(err.Error(), c.want) || out != nil || files != nil {
			t.Errorf("%s: %q, %d files, %v; want refused (%s)", c.req, out, len(files), err, c.want)
		}
	}
}

// TestNetHelperRate: after its burst the helper makes at most
// netHelperRate networks a second.
func TestNetHelperRate(t *testing.T) {
	l := newNetRateLimit()
	l.tokens = 2
	allowed := 0
	for range 10 {
		if l.allow() {
			allowed++
		}
	}
	if allowed < 2 || allowed > 3 {
		t.Errorf("%d of 10 allowed at once with 2 tokens left", allowed)
	}
}
