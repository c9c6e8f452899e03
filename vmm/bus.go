package vmm

import (
	"fmt"
	"sort"
	"sync"
)

// Device is something on a bus: port I/O or MMIO. offset is relative to the
// range the device was added at; len(data) is the access size (1..8 bytes).
// Read fills data. Implementations are called from vCPU threads, possibly
// several at once, and must do their own locking.
type Device interface {
	Read(offset uint64, data []byte)
	Write(offset uint64, data []byte)
}

// Bus routes accesses to the device owning an address range. Ranges are
// added during setup and never overlap; lookups are safe from any thread.
type Bus struct {
	mu     sync.RWMutex
	ranges []busRange // sorted by base
}

type busRange struct {
	base, size uint64
	dev        Device
}

// Add places dev at [base, base+size).
func (b *Bus) Add(base, size uint64, dev Device) error {
	if size == 0 || base+size < base {
		return fmt.Errorf("vmm: bad bus range [%#x, +%#x)", base, size)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.ranges {
		if base < r.base+r.size && r.base < base+size {
			return fmt.Errorf("vmm: bus range [%#x, +%#x) overlaps [%#x, +%#x)", base, size, r.base, r.size)
		}
	}
	b.ranges = append(b.ranges, busRange{base, size, dev})
	sort.Slice(b.ranges, func(i, j int) bool { return b.ranges[i].base < b.ranges[j].base })
	return nil
}

func (b *Bus) find(addr uint64) (busRange, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	i := sort.Search(len(b.ranges), func(i int) bool { return b.ranges[i].base+b.ranges[i].size > addr })
	if i < len(b.ranges) && b.ranges[i].base <= addr {
		return b.ranges[i], true
	}
	return busRange{}, false
}

// Read dispatches a read; unclaimed addresses read as all ones, like a
// floating bus. It reports whether a device claimed the address.
func (b *Bus) Read(addr uint64, data []byte) bool {
	if r, ok := b.find(addr); ok {
		r.dev.Read(addr-r.base, data)
		return true
	}
	for i := range data {
		data[i] = 0xff
	}
	return false
}

// Write dispatches a write; writes to unclaimed addresses are dropped. It
// reports whether a device claimed the address.
func (b *Bus) Write(addr uint64, data []byte) bool {
	if r, ok := b.find(addr); ok {
		r.dev.Write(addr-r.base, data)
		return true
	}
	return false
}
