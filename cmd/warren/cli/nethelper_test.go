package cli

import (
	"strings"
	"testing"
)

// TestNetHelperRefuses: what a subverted VMM might ask its jail-init's
// helper for, beyond a private network with a tap of a plain name, is
// refused before anything is made.
func TestNetHelperRefuses(t *testing.T) {
	for _, c := range []struct{ req, want string }{
		{`{"tap": "../../etc"}`, "tap name"},
		{`{"tap": "averyveryverylongname"}`, "tap name"},
		{`{"tap": ""}`, "tap name"},
		{`{"tap": "wt0", "netns": "/proc/1/ns/net"}`, "unknown field"},
		{`{"tap": "wt0", "private": false}`, "unknown field"},
		{`not json`, "bad request"},
	} {
		out, files, err := serveNetRequest(-1, []byte(c.req))
		if err == nil || !strings.Contains(err.Error(), c.want) || out != nil || files != nil {
			t.Errorf("%s: %q, %d files, %v; want refused (%s)", c.req, out, len(files), err, c.want)
		}
	}
}

// TestNetHelperRate: after its burst the helper makes at most
// netHelperRate networks a second.
func TestNetHelperRate(t *testing.T) {
	l := &netHelperLimit
	l.Lock()
	saved := l.tokens
	l.tokens = 2
	l.Unlock()
	defer func() {
		l.Lock()
		l.tokens = saved
		l.Unlock()
	}()
	allowed := 0
	for range 10 {
		if netHelperAllow() {
			allowed++
		}
	}
	if allowed < 2 || allowed > 3 {
		t.Errorf("%d of 10 allowed at once with 2 tokens left", allowed)
	}
}
