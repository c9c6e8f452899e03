package vmm

import (
	"bytes"
	"io"
	"sync"
	"time"
)

// panicWatcher passes console output through and remembers whether the
// guest kernel printed a panic, so a reset that follows one is reported as a
// failure rather than a clean power-off.
type panicWatcher struct {
	mu       sync.Mutex
	w        io.Writer
	line     []byte
	panicked string
}

const panicMarker = "Kernel panic - not syncing"

func (p *panicWatcher) Write(b []byte) (int, error) {
	p.mu.Lock()
	for _, c := range b {
		if c == '\n' {
			if p.panicked == "" && bytes.Contains(p.line, []byte(panicMarker)) {
				p.panicked = string(bytes.TrimSpace(p.line))
			}
			p.line = p.line[:0]
		} else if len(p.line) < 512 {
			p.line = append(p.line, c)
		}
	}
	p.mu.Unlock()
	return p.w.Write(b)
}

// Panic returns the panic line, or "" if the guest has not panicked.
func (p *panicWatcher) Panic() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.panicked == "" && bytes.Contains(p.line, []byte(panicMarker)) {
		return string(bytes.TrimSpace(p.line))
	}
	return p.panicked
}

// lineBuffer batches console output: the UART hands over one byte per
// guest port write, and a write(2) per byte would stall the vCPU thread that
// much longer. Complete lines go out at once; a partial line (a shell
// prompt) goes out after flushDelay. Safe for concurrent use.
type lineBuffer struct {
	mu    sync.Mutex
	w     io.Writer
	buf   []byte
	timer *time.Timer
	err   error
}

const flushDelay = 5 * time.Millisecond

func newLineBuffer(w io.Writer) *lineBuffer { return &lineBuffer{w: w} }

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if i := bytes.LastIndexByte(l.buf, '\n'); i >= 0 || len(l.buf) >= 4096 {
		if i < 0 {
			i = len(l.buf) - 1
		}
		l.writeLocked(i + 1)
	}
	if len(l.buf) > 0 && l.timer == nil {
		l.timer = time.AfterFunc(flushDelay, func() { l.Flush() })
	}
	return len(p), l.err
}

// writeLocked writes out the first n buffered bytes (mu held).
func (l *lineBuffer) writeLocked(n int) {
	if l.err == nil {
		_, l.err = l.w.Write(l.buf[:n])
	}
	l.buf = append(l.buf[:0], l.buf[n:]...)
}

// Flush writes out everything buffered and returns the first write error.
func (l *lineBuffer) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if len(l.buf) > 0 {
		l.writeLocked(len(l.buf))
	}
	return l.err
}
