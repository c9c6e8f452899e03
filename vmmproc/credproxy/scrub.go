package credproxy

import (
	"bytes"
	"io"
	"sort"
	"strings"
)

// pair is one replacement: every occurrence of old becomes new.
type pair struct {
	old, new string
}

// normPairs drops empty and duplicate olds (the first one wins) and sorts
// the rest longest first, so that at a given position the longest old
// wins: the same leftmost-longest rule strings.NewReplacer applies to
// pairs in that order.
func normPairs(ps []pair) []pair {
	seen := map[string]bool{}
	var out []pair
	for _, p := range ps {
		if p.old == "" || seen[p.old] {
			continue
		}
		seen[p.old] = true
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i].old) > len(out[j].old) })
	return out
}

// replaceAll applies ps (normalized) to s, leftmost-longest, without
// re-scanning replaced text.
func replaceAll(s string, ps []pair) string {
	if len(ps) == 0 {
		return s
	}
	args := make([]string, 0, 2*len(ps))
	for _, p := range ps {
		args = append(args, p.old, p.new)
	}
	return strings.NewReplacer(args...).Replace(s)
}

// scrubber is a streaming io.WriteCloser that replaces every occurrence of
// each old (a secret) with its new (the placeholder) in what is written
// through it, also across writes. It holds back at most the longest old
// less one byte, never the whole stream; Close writes what it holds.
type scrubber struct {
	w      io.Writer
	ps     []pair
	maxLen int
	tail   []byte // bytes not yet written that may start a match
	out    []byte // reused output buffer
	err    error
}

func newScrubber(w io.Writer, ps []pair) *scrubber {
	ps = normPairs(ps)
	s := &scrubber{w: w, ps: ps}
	for _, p := range ps {
		s.maxLen = max(s.maxLen, len(p.old))
	}
	return s
}

// Write consumes all of p (reporting len(p)) unless the underlying
// writer fails.
func (s *scrubber) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if len(s.ps) == 0 {
		_, s.err = s.w.Write(p)
		if s.err != nil {
			return 0, s.err
		}
		return len(p), nil
	}
	buf := append(s.tail, p...)
	keep := s.process(buf, len(buf)-(s.maxLen-1))
	s.tail = append(s.tail[:0], buf[keep:]...)
	if err := s.flushOut(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// process scans buf, appending to s.out the scrubbed bytes of every
// position before limit (and of any match starting there), and returns
// the index of the first byte not consumed. A match starting before
// limit lies wholly in buf, and so does any match that starts earlier,
// so the leftmost-longest choice cannot be changed by later bytes.
func (s *scrubber) process(buf []byte, limit int) int {
	i := 0
	for i < limit {
		j, pi := -1, -1
		for k, p := range s.ps {
			x := bytes.Index(buf[i:], []byte(p.old))
			if x >= 0 && (j < 0 || x < j) { // longest first, so ties keep the longer
				j, pi = x, k
			}
		}
		if j < 0 || i+j >= limit {
			s.out = append(s.out, buf[i:limit]...)
			return limit
		}
		s.out = append(s.out, buf[i:i+j]...)
		s.out = append(s.out, s.ps[pi].new...)
		i += j + len(s.ps[pi].old)
	}
	return max(i, 0)
}

func (s *scrubber) flushOut() error {
	if len(s.out) == 0 {
		return nil
	}
	_, s.err = s.w.Write(s.out)
	s.out = s.out[:0]
	return s.err
}

// Close writes the held-back tail (scrubbed). It does not close the
// underlying writer.
func (s *scrubber) Close() error {
	if s.err != nil {
		return s.err
	}
	if len(s.tail) > 0 {
		n := s.process(s.tail, len(s.tail))
		s.out = append(s.out, s.tail[n:]...)
		s.tail = s.tail[:0]
	}
	return s.flushOut()
}
