package fleettest

import (
	"testing"
	"time"
)

// Eventually polls cond every interval until it holds, for at most d,
// and fails the test with what and cond's last word if it never does.
func Eventually(t testing.TB, d, interval time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last: %s", what, d, last)
		}
		time.Sleep(interval)
	}
}
