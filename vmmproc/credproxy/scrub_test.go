package credproxy

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// scrubChunks writes in through a scrubber split at the given cut points.
func scrubChunks(t testing.TB, in string, ps []pair, cuts []int) string {
	t.Helper()
	var out bytes.Buffer
	s := newScrubber(&out, ps)
	prev := 0
	for _, c := range cuts {
		if c < prev || c > len(in) {
			continue
		}
		if n, err := s.Write([]byte(in[prev:c])); err != nil || n != c-prev {
			t.Fatalf("Write: %d, %v", n, err)
		}
		prev = c
	}
	if _, err := s.Write([]byte(in[prev:])); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestScrubberTable(t *testing.T) {
	secret := "sk-live-0123456789"
	ph := "warren-placeholder-API"
	ps := []pair{{secret, ph}}
	cases := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"none", "hello world", "hello world"},
		{"whole", secret, ph},
		{"embedded", "auth=" + secret + "&x=1", "auth=" + ph + "&x=1"},
		{"twice", secret + secret, ph + ph},
		{"prefix only", "sk-live-01234", "sk-live-01234"},
		{"prefix then full", "sk-live-" + secret, "sk-live-" + ph},
		{"overlap-ish", "sk-live-sk-live-0123456789x", "sk-live-" + ph + "x"},
	}
	for _, c := range cases {
		// Every split into two and three pieces.
		for i := 0; i <= len(c.in); i++ {
			for j := i; j <= len(c.in); j++ {
				if got := scrubChunks(t, c.in, ps, []int{i, j}); got != c.want {
					t.Fatalf("%s cut %d,%d: got %q, want %q", c.name, i, j, got, c.want)
				}
			}
		}
	}
}

func TestScrubberByteAtATime(t *testing.T) {
	ps := []pair{{"AAAsecretAAA", "<a>"}, {"token-xyz", "<b>"}, {"z", "<z>"}}
	in := strings.Repeat("..AAAsecretAAA..token-xyz..AAAsecretAA", 50) + "token-xy"
	cuts := make([]int, len(in))
	for i := range cuts {
		cuts[i] = i
	}
	want := replaceAll(in, normPairs(ps))
	if got := scrubChunks(t, in, ps, cuts); got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if strings.Contains(want, "AAAsecretAAA") || strings.Contains(want, "token-xyz") {
		t.Fatal("reference left a secret")
	}
}

// TestScrubberHoldsBackLittle checks that the scrubber streams: after a
// write, all but the longest secret's length less one byte is out.
func TestScrubberHoldsBackLittle(t *testing.T) {
	var out bytes.Buffer
	s := newScrubber(&out, []pair{{"0123456789", "X"}})
	s.Write(bytes.Repeat([]byte("a"), 1000))
	if out.Len() != 1000-9 {
		t.Fatalf("%d bytes out after 1000 in, want %d", out.Len(), 991)
	}
	s.Close()
	if out.Len() != 1000 {
		t.Fatalf("%d bytes after Close", out.Len())
	}
}

func TestScrubberRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alpha := "ab"
	for iter := 0; iter < 3000; iter++ {
		var ps []pair
		for k := 0; k < 1+r.IntN(3); k++ {
			var b strings.Builder
			for n := 1 + r.IntN(5); n > 0; n-- {
				b.WriteByte(alpha[r.IntN(len(alpha))])
			}
			ps = append(ps, pair{b.String(), "<" + strings.Repeat("P", k) + ">"})
		}
		var in strings.Builder
		for n := r.IntN(40); n > 0; n-- {
			in.WriteByte(alpha[r.IntN(len(alpha))])
		}
		var cuts []int
		for n := r.IntN(6); n > 0; n-- {
			cuts = append(cuts, r.IntN(in.Len()+1))
		}
		sortInts(cuts)
		want := replaceAll(in.String(), normPairs(ps))
		if got := scrubChunks(t, in.String(), ps, cuts); got != want {
			t.Fatalf("pairs %q input %q cuts %v: got %q, want %q", ps, in.String(), cuts, got, want)
		}
	}
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func FuzzScrubber(f *testing.F) {
	f.Add("xxsecretyy", "secret", "cret", 3, 7)
	f.Add("aaaa", "aa", "a", 1, 2)
	f.Fuzz(func(t *testing.T, in, s1, s2 string, c1, c2 int) {
		if len(s1) > 64 || len(s2) > 64 || len(in) > 4096 {
			return
		}
		ps := []pair{{s1, "<1>"}, {s2, "<2>"}}
		if c1 < 0 {
			c1 = -c1
		}
		if c2 < 0 {
			c2 = -c2
		}
		cuts := []int{c1 % (len(in) + 1), c2 % (len(in) + 1)}
		sortInts(cuts)
		want := replaceAll(in, normPairs(ps))
		if got := scrubChunks(t, in, ps, cuts); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	})
}
