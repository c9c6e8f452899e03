package vmm

import (
	"bytes"
	"io"
	"sync"
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
