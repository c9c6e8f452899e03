// Package logcap bounds the logs a guest can make the host write: the
// guest console, which the guest writes at will, and the VMM's own log,
// which guest-triggered events (a driver fault, a device reset) add lines
// to. Neither may grow the host's disk without bound.
//
// A Rotating file keeps the newest bytes in FILE and the ones before in
// FILE.1, each at most Max bytes: it works on descriptors opened once at
// the start (pwrite, ftruncate and copy), so a VMM keeps rotating its
// console after its jail takes away path lookups. A Budget passes at most
// a set number of bytes to its writer and then drops the rest, once
// saying so.
package logcap

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
)

// DefaultConsoleMax is the most bytes a Rotating console keeps in each of
// its two files (16 MiB: 32 MiB of console per VMM at most).
const DefaultConsoleMax = 16 << 20

// Rotating is a log file capped at Max bytes, rotated to Path+".1" (the
// one older generation kept) when a write would pass Max. It is safe for
// concurrent use.
type Rotating struct {
	// Path is the file's name, for messages.
	Path string
	// Max is each generation's size limit.
	Max int64

	mu sync.Mutex // guards cur, old, size, rotations
	// cur is the current generation (read-write, for the copy to old),
	// old the previous one.
	cur, old  *os.File
	size      int64
	rotations int
}

// Create truncates or creates path and path.1 (mode 0600) and returns the
// Rotating file writing to them; max <= 0 is DefaultConsoleMax.
func Create(path string, max int64) (*Rotating, error) {
	if max <= 0 {
		max = DefaultConsoleMax
	}
	cur, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	old, err := os.OpenFile(path+".1", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		cur.Close()
		return nil, err
	}
	return &Rotating{Path: path, Max: max, cur: cur, old: old}, nil
}

// Append opens path and path.1 (created 0600 when missing) keeping what
// they hold, and returns the Rotating file appending to path: a log that
// lives across processes (a sandbox's egress audit log, reopened by each
// VMM that restores it). A path already past max (written with another
// cap, or none) is rotated first, path.1 getting its last max bytes from
// the start of a line; max <= 0 is DefaultConsoleMax.
func Append(path string, max int64) (*Rotating, error) {
	if max <= 0 {
		max = DefaultConsoleMax
	}
	cur, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	old, err := os.OpenFile(path+".1", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		cur.Close()
		return nil, err
	}
	r := &Rotating{Path: path, Max: max, cur: cur, old: old}
	fi, err := cur.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s: not a regular file", path)
	}
	if err == nil {
		if r.size = fi.Size(); r.size > max {
			err = r.rotateTail()
		}
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Write appends p, rotating first when the current generation would pass
// Max. Of a single write longer than Max only its last Max bytes are kept.
func (r *Rotating) Write(p []byte) (int, error) {
	n := len(p)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return 0, os.ErrClosed
	}
	if int64(len(p)) > r.Max {
		p = p[int64(len(p))-r.Max:]
	}
	if r.size+int64(len(p)) > r.Max {
		if err := r.rotate(); err != nil {
			return 0, fmt.Errorf("%s: rotate: %w", r.Path, err)
		}
	}
	k, err := r.cur.WriteAt(p, r.size)
	r.size += int64(k)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// rotate moves the current generation's bytes to the old one and empties
// the current one (mu held).
func (r *Rotating) rotate() error { return r.rotateFrom(0) }

// rotateFrom is rotate keeping only the current generation's bytes from
// off on (mu held, or r not yet shared).
func (r *Rotating) rotateFrom(off int64) error {
	if err := r.old.Truncate(0); err != nil {
		return err
	}
	if _, err := io.Copy(&offsetWriter{f: r.old}, io.NewSectionReader(r.cur, off, r.size-off)); err != nil {
		return err
	}
	if err := r.cur.Truncate(0); err != nil {
		return err
	}
	r.size = 0
	r.rotations++
	return nil
}

// rotateTail is rotate for a current generation past Max: the old one
// gets its last Max bytes, from the first line that starts in them (mu
// held, or r not yet shared).
func (r *Rotating) rotateTail() error {
	off := r.size - r.Max
	if off > 0 {
		var b [1]byte
		if _, err := r.cur.ReadAt(b[:], off-1); err != nil {
			return err
		}
		if b[0] != '\n' {
			// Mid-line: skip to the next line's start, if there is one.
			buf := make([]byte, 4096)
			for o := off; o < r.size; {
				n, err := r.cur.ReadAt(buf[:min(int64(len(buf)), r.size-o)], o)
				if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
					off = o + int64(i) + 1
					break
				}
				if err != nil {
					return err
				}
				if o += int64(n); o == r.size {
					off = r.size // one line longer than Max: nothing kept
				}
			}
		}
	}
	return r.rotateFrom(off)
}

// Rotations returns how many times the file has rotated.
func (r *Rotating) Rotations() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rotations
}

// Close closes both generations.
func (r *Rotating) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return nil
	}
	err := r.cur.Close()
	if e := r.old.Close(); err == nil {
		err = e
	}
	r.cur, r.old = nil, nil
	return err
}

// offsetWriter writes to f from offset 0 on with pwrite.
type offsetWriter struct {
	f   *os.File
	off int64
}

func (w *offsetWriter) Write(p []byte) (int, error) {
	n, err := w.f.WriteAt(p, w.off)
	w.off += int64(n)
	return n, err
}

// Budget is a writer passing at most Limit bytes to W in all, whole
// writes only; after that, one line saying so and then nothing, while
// reporting success (a log must not fail its caller). It is safe for
// concurrent use if W is.
type Budget struct {
	W     io.Writer
	Limit int64

	mu      sync.Mutex // guards used, dropped
	used    int64
	dropped int64
}

// NewBudget returns a Budget of limit bytes over w. When w is a regular
// file (a VMM's stderr, appended to its log) already holding limit bytes
// or more, it is truncated first, with a line saying so: each VMM
// process starts with the file bounded.
func NewBudget(w io.Writer, limit int64) *Budget {
	b := &Budget{W: w, Limit: limit}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() >= limit {
			if f.Truncate(0) == nil {
				fmt.Fprintf(w, "logcap: log truncated at %d bytes (the limit is %d)\n", fi.Size(), limit)
			}
		}
	}
	return b
}

// Write passes p on while the budget lasts.
func (b *Budget) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+int64(len(p)) > b.Limit {
		if b.dropped == 0 {
			fmt.Fprintf(b.W, "logcap: log limit of %d bytes reached: dropping what follows\n", b.Limit)
		}
		b.dropped += int64(len(p))
		b.used = b.Limit
		return len(p), nil
	}
	b.used += int64(len(p))
	return b.W.Write(p)
}

// Dropped returns how many bytes were dropped.
func (b *Budget) Dropped() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}
