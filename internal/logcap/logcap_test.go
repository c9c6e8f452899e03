package logcap

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestRotatingHostileConsole: a guest writes 40 MiB of console, in lines
// and in one huge write; the host keeps at most 2×Max bytes, the newest
// ones, in FILE and FILE.1.
func TestRotatingHostileConsole(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	const limit = 1 << 20
	r, err := Create(p, limit)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40000; i++ {
				fmt.Fprintf(r, "guest %d line %08d %s\n", g, i, strings.Repeat("x", 200))
			}
		}()
	}
	wg.Wait()
	if _, err := r.Write(bytes.Repeat([]byte("H"), 3*limit)); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(r, "the last line\n")
	r.Close()
	cur, _ := os.ReadFile(p)
	old, _ := os.ReadFile(p + ".1")
	if len(cur) > limit || len(old) > limit {
		t.Fatalf("console %d bytes, .1 %d bytes: want each at most %d", len(cur), len(old), limit)
	}
	if !strings.HasSuffix(string(cur), "the last line\n") {
		t.Errorf("the newest bytes are not in %s: ends %q", p, cur[max(0, len(cur)-40):])
	}
	if !bytes.Equal(old, bytes.Repeat([]byte("H"), limit)) {
		t.Errorf(".1 holds %d bytes, want the huge write's last %d", len(old), limit)
	}
	if r.Rotations() < 30 {
		t.Errorf("%d rotations", r.Rotations())
	}
	if _, err := r.Write([]byte("x")); err == nil {
		t.Error("write after Close succeeded")
	}
}

// TestBudget: past its limit a Budget drops writes (reporting success),
// saying so once; a log file already past the limit is truncated.
func TestBudget(t *testing.T) {
	var buf bytes.Buffer
	b := NewBudget(&buf, 100)
	for i := 0; i < 1000; i++ {
		if n, err := fmt.Fprintf(b, "line %04d\n", i); err != nil || n != 10 {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
	}
	if buf.Len() > 100+200 || strings.Count(buf.String(), "log limit") != 1 {
		t.Fatalf("%d bytes: %q", buf.Len(), buf.String())
	}
	if b.Dropped() != 9900 {
		t.Errorf("dropped %d", b.Dropped())
	}

	p := filepath.Join(t.TempDir(), "vmm.log")
	os.WriteFile(p, bytes.Repeat([]byte("old\n"), 1000), 0o600)
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	defer f.Close()
	fb := NewBudget(f, 1000)
	fmt.Fprintf(fb, "new\n")
	got, _ := os.ReadFile(p)
	if len(got) > 200 || !strings.HasSuffix(string(got), "new\n") || !strings.Contains(string(got), "truncated") {
		t.Errorf("log after NewBudget: %q", got)
	}
}

// TestAppendKeepsAndCaps: Append keeps what the files hold and appends to
// it; a file already past the cap is rotated before anything is written.
func TestAppendKeepsAndCaps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	r, err := Append(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	r.Write([]byte("abc"))
	r.Close()
	if r, err = Append(path, 10); err != nil {
		t.Fatal(err)
	}
	r.Write([]byte("def"))
	r.Close()
	if b, _ := os.ReadFile(path); string(b) != "abcdef" {
		t.Fatalf("after two opens: %q", b)
	}
	for _, c := range []struct{ had, want string }{
		{"aaaa\nbbbb\ncccc\n", "bbbb\ncccc\n"}, // the tail starts a line
		{"aaaaaaaa\nb\ncccc\n", "b\ncccc\n"},   // mid-line: from the next one
		{"0123456789ABCDEF", ""},               // one line past the cap
	} {
		if err := os.WriteFile(path, []byte(c.had), 0o600); err != nil {
			t.Fatal(err)
		}
		if r, err = Append(path, 10); err != nil {
			t.Fatal(err)
		}
		r.Write([]byte("x"))
		r.Close()
		cur, _ := os.ReadFile(path)
		old, _ := os.ReadFile(path + ".1")
		if string(cur) != "x" || string(old) != c.want {
			t.Errorf("%q past the cap of 10: %q, .1 %q; want .1 %q", c.had, cur, old, c.want)
		}
	}
}
