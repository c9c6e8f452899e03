package vmmverbs

import (
	"bytes"
	"strings"
	"testing"
)

// TestRun: the VMM's verbs are run (a bad flag is a usage error, 2), any
// other is not theirs.
func TestRun(t *testing.T) {
	var out, errb bytes.Buffer
	for _, v := range []string{"exec", "ls", "store", "help", ""} {
		if _, ok := Run(v, nil, strings.NewReader(""), &out, &errb); ok {
			t.Errorf("%q taken as a VMM verb", v)
		}
	}
	for _, v := range []string{"run", "restore"} {
		errb.Reset()
		code, ok := Run(v, []string{"--no-such-flag"}, strings.NewReader(""), &out, &errb)
		if !ok || code != 2 || !strings.Contains(errb.String(), "no-such-flag") {
			t.Errorf("%s --no-such-flag: %d, %v, %q", v, code, ok, errb.String())
		}
	}
}
