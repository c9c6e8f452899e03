package ident

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// TestAgainstRegexps: each check agrees with the regular expression it
// replaces, on edge cases and on random strings over an alphabet that
// has every class's edges.
func TestAgainstRegexps(t *testing.T) {
	checks := []struct {
		re string
		f  func(string) bool
	}{
		{`^[a-z0-9-]{1,63}$`, Tenant},
		{`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`, func(s string) bool { return Name(s, 64) }},
		{`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`, func(s string) bool { return Name(s, 128) }},
		{`^[0-9a-f]{12}$`, func(s string) bool { return LowerHex(s, 12) }},
		{`^[a-z]{2,3}$`, func(s string) bool { return Lower(s, 2, 3) }},
	}
	alphabet := []byte("az09AZ-_./`{@[:G g\n\x00\xff")
	r := rand.New(rand.NewPCG(1, 2))
	samples := []string{"", ".", "..", "a\n", "ab\n", "-", "a", "A", "0", "_a", ".a", "a.b", "sb-0123456789ab", "ab", "abcd", "0123456789ab", "0123456789AB"}
	for n := 60; n < 70; n++ {
		samples = append(samples, string(make([]byte, n)))
		b := make([]byte, n)
		for i := range b {
			b[i] = 'a'
		}
		samples = append(samples, string(b))
	}
	for range 20000 {
		b := make([]byte, r.IntN(140))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		samples = append(samples, string(b))
		for i := range b {
			b[i] = "abcdef0123456789"[r.IntN(16)]
		}
		samples = append(samples, string(b[:min(len(b), 1+r.IntN(14))]))
	}
	for _, c := range checks {
		re := regexp.MustCompile(c.re)
		for _, s := range samples {
			if got, want := c.f(s), re.MatchString(s); got != want {
				t.Errorf("%s on %q: %v, the regexp says %v", c.re, s, got, want)
			}
		}
	}
}
