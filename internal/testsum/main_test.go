package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestSummary: a failed test's output is printed, a passed one's not,
// skips are grouped by reason with the file:line prefix left out, and a
// failure is remembered.
func TestSummary(t *testing.T) {
	in := []string{
		`{"Action":"run","Package":"github.com/warrenvm/warren/a","Test":"TestOK"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/a","Test":"TestOK","Output":"    a_test.go:3: chatter\n"}`,
		`{"Action":"pass","Package":"github.com/warrenvm/warren/a","Test":"TestOK"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/a","Test":"TestBad","Output":"    a_test.go:9: boom\n"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/a","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}`,
		`{"Action":"fail","Package":"github.com/warrenvm/warren/a","Test":"TestBad"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/a","Test":"TestKVM","Output":"    k_test.go:5: skipped: no /dev/kvm\n"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/a","Test":"TestKVM","Output":"--- SKIP: TestKVM (0.00s)\n"}`,
		`{"Action":"skip","Package":"github.com/warrenvm/warren/a","Test":"TestKVM"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/b","Test":"TestKVM2","Output":"    other_test.go:77: skipped: no /dev/kvm\n"}`,
		`{"Action":"skip","Package":"github.com/warrenvm/warren/b","Test":"TestKVM2"}`,
		`{"Action":"skip","Package":"github.com/warrenvm/warren/b","Test":"TestSilent"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/a","Output":"PASS\n"}`,
		`{"Action":"output","Package":"github.com/warrenvm/warren/a","Output":"FAIL\tgithub.com/warrenvm/warren/a\t0.1s\n"}`,
		`{"Action":"fail","Package":"github.com/warrenvm/warren/a"}`,
		`not an event`,
	}
	var out bytes.Buffer
	s := newSummary(&out, false)
	for _, l := range in {
		s.line(l)
	}
	s.print("")
	got := out.String()
	for _, want := range []string{"boom", "--- FAIL: TestBad", "FAIL\tgithub.com/warrenvm/warren/a", "not an event",
		"3 tests skipped, for 2 reasons", "2  skipped: no /dev/kvm\n       a.TestKVM, b.TestKVM2", "1  (no reason given)"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"chatter", "PASS\n"} {
		if strings.Contains(got, not) {
			t.Errorf("output has %q:\n%s", not, got)
		}
	}
	if !s.failed {
		t.Error("the failure was not remembered")
	}

	out.Reset()
	s = newSummary(&out, true)
	for _, l := range in {
		s.line(l)
	}
	s.print(" (nested)")
	if got := out.String(); strings.Contains(got, "boom") || !strings.HasPrefix(got, "testsum (nested): 3 tests skipped") {
		t.Errorf("-skips-only:\n%s", got)
	}
}
