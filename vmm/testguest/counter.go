package testguest

import (
	"bytes"
	"encoding/binary"
	"sync"
)

// The counter guest (vmm/testdata/guests/counter.S) counts at CounterAddr
// and in EBX, prints a dot now and then, and reads port CounterPort (which
// must answer 1: OnePort) to decide whether to go on.
const (
	CounterAddr = 0x300000
	CounterPort = 0x510
)

// OnePort is a port I/O device whose reads return 1 (little-endian) and
// whose writes are ignored: the counter guest's CounterPort.
type OnePort struct{}

// Read implements the VMM's port device.
func (OnePort) Read(_ uint64, data []byte) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], 1)
	copy(data, b[:])
}

// Write implements the VMM's port device.
func (OnePort) Write(uint64, []byte) {}

// SyncBuffer is a bytes.Buffer that a guest console writes and a test
// reads concurrently.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
