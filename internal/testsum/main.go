// Command testsum reads `go test -json` events (or `go tool test2json`'s)
// on standard input and prints what a plain `go test` would (each
// package's ok or FAIL line, build errors, and the whole output of every
// failed test), then a summary of the tests that were skipped, grouped by
// the reason each gave (its last line of output before the skip): a test
// that cannot run on this host says so at the end of `make test`, not
// only in a verbose log.
//
//	go test -json ./... 2>&1 | testsum [-title WHERE]
//	go tool test2json -p PKG < LOG | testsum -skips-only [-title WHERE]
//
// It exits 1 when a test or a package failed (a line that is not an
// event is printed as it is), else 0. -skips-only prints only the
// summary (the tests' output was shown already), counting a test skipped
// in several logs once.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one test2json record.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// modulePrefix is left out of package names in the summary.
const modulePrefix = "github.com/warrenvm/warren/"

// summary accumulates what testsum prints at the end.
type summary struct {
	out       io.Writer
	skipsOnly bool
	// buf is each running test's output, by package and test.
	buf map[string][]string
	// skipped is each skipped test's reason, by package and test.
	skipped map[string]string
	failed  bool
}

func newSummary(out io.Writer, skipsOnly bool) *summary {
	return &summary{out: out, skipsOnly: skipsOnly, buf: map[string][]string{}, skipped: map[string]string{}}
}

// line takes one line of input.
func (s *summary) line(l string) {
	var e event
	if !strings.HasPrefix(l, "{") || json.Unmarshal([]byte(l), &e) != nil || e.Action == "" {
		if !s.skipsOnly {
			fmt.Fprintln(s.out, l)
		}
		return
	}
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "output", "build-output":
		if e.Test != "" {
			s.buf[key] = append(s.buf[key], e.Output)
		} else if !s.skipsOnly && e.Output != "PASS\n" {
			fmt.Fprint(s.out, e.Output)
		}
	case "fail", "build-fail":
		s.failed = true
		if e.Test != "" && !s.skipsOnly {
			fmt.Fprint(s.out, strings.Join(s.buf[key], ""))
		}
		delete(s.buf, key)
	case "skip":
		if e.Test != "" {
			s.skipped[key] = reason(s.buf[key])
		}
		delete(s.buf, key)
	case "pass":
		delete(s.buf, key)
	}
}

// reason is a skipped test's last line of its own output: what it gave
// t.Skip, with the file:line prefix the testing package adds.
func reason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ") {
			continue
		}
		return l
	}
	return "(no reason given)"
}

// print writes the summary of skips.
func (s *summary) print(title string) {
	if len(s.skipped) == 0 {
		fmt.Fprintf(s.out, "testsum%s: no test skipped\n", title)
		return
	}
	byReason := map[string][]string{}
	for key, r := range s.skipped {
		pkg, test, _ := strings.Cut(key, "\x00")
		// The file:line prefix differs by test; the reason after it
		// groups them.
		if _, rest, ok := strings.Cut(r, ".go:"); ok {
			if _, after, ok := strings.Cut(rest, ": "); ok {
				r = after
			}
		}
		byReason[r] = append(byReason[r], strings.TrimPrefix(pkg, modulePrefix)+"."+test)
	}
	reasons := make([]string, 0, len(byReason))
	for r := range byReason {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if a, b := len(byReason[reasons[i]]), len(byReason[reasons[j]]); a != b {
			return a > b
		}
		return reasons[i] < reasons[j]
	})
	fmt.Fprintf(s.out, "testsum%s: %s skipped, for %s:\n", title, plural(len(s.skipped), "test"), plural(len(reasons), "reason"))
	for _, r := range reasons {
		tests := byReason[r]
		sort.Strings(tests)
		shown := tests
		if len(shown) > 6 {
			shown = shown[:6]
		}
		more := ""
		if len(tests) > len(shown) {
			more = fmt.Sprintf(" and %d more", len(tests)-len(shown))
		}
		fmt.Fprintf(s.out, "  %3d  %s\n       %s%s\n", len(tests), r, strings.Join(shown, ", "), more)
	}
}

// plural is "1 test", "2 tests".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func main() {
	skipsOnly := flag.Bool("skips-only", false, "print only the summary of skipped tests")
	title := flag.String("title", "", "where the tests ran, for the summary's first line")
	flag.Parse()
	s := newSummary(os.Stdout, *skipsOnly)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		s.line(sc.Text())
	}
	t := ""
	if *title != "" {
		t = " (" + *title + ")"
	}
	s.print(t)
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	if s.failed && !*skipsOnly {
		os.Exit(1)
	}
}
