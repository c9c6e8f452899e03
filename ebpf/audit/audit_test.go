package audit

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func readRecords(t *testing.T, path string) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestLogWritesJSONLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, "sb1", 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	l.Record(Record{Source: SourceFilter, Verdict: Deny, Proto: "tcp", Dst: "192.0.2.1", DstPort: 22, Reason: "no-rule"})
	l.Record(Record{Source: SourceDNS, Verdict: Allow, Name: "a.example.com", Addrs: []string{"192.0.2.7"}})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rs := readRecords(t, path)
	if len(rs) != 2 {
		t.Fatalf("%d records", len(rs))
	}
	if rs[0].Sandbox != "sb1" || rs[0].Time.IsZero() || rs[0].DstPort != 22 || rs[1].Addrs[0] != "192.0.2.7" {
		t.Errorf("records: %+v", rs)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
}

// TestLogRateLimit floods the log with a fake clock: past the burst,
// records are counted and written later as one suppressed record.
func TestLogRateLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path, "sb", 10, 20, 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for i := 0; i < 10000; i++ {
		l.Record(Record{Source: SourceFilter, Verdict: Deny})
	}
	w, s := l.Stats()
	if w != 20 || s != 9980 {
		t.Fatalf("written %d suppressed %d, want 20 and 9980", w, s)
	}
	now = now.Add(time.Second) // 10 more tokens
	l.Record(Record{Source: SourceFilter, Verdict: Allow})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rs := readRecords(t, path)
	if len(rs) != 22 {
		t.Fatalf("%d records, want 22", len(rs))
	}
	if rs[20].Reason != "suppressed" || rs[20].Count != 9980 || rs[21].Verdict != Allow {
		t.Errorf("tail: %+v %+v", rs[20], rs[21])
	}
}

// TestLogSizeCap: a guest within the rate limit still cannot grow the
// log past its cap: it rotates to FILE.1, each generation at most
// maxBytes and made of whole records, the newest in FILE; reopened (a
// restored VMM), the log appends to what is there and keeps the cap.
func TestLogSizeCap(t *testing.T) {
	const maxBytes = 4 << 10
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	clock := time.Unix(1e9, 0)
	write := func(from, n int) {
		l, err := Open(path, "sb", 1e6, 1e6, maxBytes)
		if err != nil {
			t.Fatal(err)
		}
		l.now = func() time.Time { clock = clock.Add(time.Second); return clock }
		for i := range n {
			l.Record(Record{Source: SourceProxy, Method: "GET", Status: 200 + (from+i)%100, Count: uint64(from + i)})
			if i%7 == 0 {
				l.Flush() // writes of various sizes reach the file
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	check := func(last int) {
		t.Helper()
		for _, p := range []string{path, path + ".1"} {
			if fi, err := os.Stat(p); err != nil || fi.Size() > maxBytes || fi.Size() == 0 {
				t.Fatalf("%s: %v, %v: want 1 to %d bytes", p, fi, err, maxBytes)
			}
		}
		old, cur := readRecords(t, path+".1"), readRecords(t, path)
		if got := cur[len(cur)-1].Count; got != uint64(last) {
			t.Errorf("the newest record is %d, want %d", got, last)
		}
		all := append(old, cur...)
		for i := 1; i < len(all); i++ {
			if all[i].Count != all[i-1].Count+1 {
				t.Fatalf("record %d follows %d: a gap inside the two generations", all[i].Count, all[i-1].Count)
			}
		}
	}
	write(0, 500) // ~40 KiB of records
	check(499)
	write(500, 30)
	check(529)
}
