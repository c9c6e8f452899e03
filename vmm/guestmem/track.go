package guestmem

// Write records with more than one reader.
//
// Two things read "the pages written since I last looked": snapshots
// (an incremental layer holds the pages written since the previous
// snapshot) and forks (a later fork copies the pages the parent wrote since
// its previous fork). Each source of writes keeps one live record that
// reading clears (the VMM's own writes here, MarkWritten; KVM's dirty log
// in package vmm), so a reader that cleared it would hide writes from the
// other. A Ledger sits between: each take moves the live record into every
// reader's own pending set and hands the taker its set, so each reader sees
// every write since its own previous take.

import "sync"

// Tracker names one reader of the write records.
type Tracker int

// The readers of write records.
const (
	// ForSnapshots is the Snapshotter's: pages to capture in the next
	// incremental snapshot.
	ForSnapshots Tracker = iota
	// ForForks is cow's: pages the parent wrote since its previous fork.
	ForForks
	numTrackers
)

// Ledger is the per-reader pending sets of one live record (bitmaps with one
// bit per page). mu guards pending; the live record is the caller's.
type Ledger struct {
	mu      sync.Mutex
	pending [numTrackers][]uint64
}

// Take ORs live (a bitmap the caller just read and cleared from its
// source) into every reader's pending set and returns t's set, now cleared,
// as a bitmap of len(live) words. live is not kept.
func (l *Ledger) Take(t Tracker, live []uint64) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.pending {
		if l.pending[i] == nil {
			l.pending[i] = make([]uint64, len(live))
		}
		p := l.pending[i]
		for w, bits := range live {
			if bits != 0 {
				p[w] |= bits
			}
		}
	}
	out := l.pending[t]
	l.pending[t] = make([]uint64, len(live))
	return out
}

// TakeWritten returns the pages the VMM wrote since t's previous call, as
// a bitmap with one bit per page of the flat memfd image (bit p%64 of word
// p/64), and clears t's record (the other reader's is kept). Call it with
// the VM paused and devices quiesced, or writes racing with it may land in
// either side.
func (m *Memory) TakeWritten(t Tracker) []uint64 {
	live := make([]uint64, len(m.written))
	for i := range m.written {
		live[i] = m.written[i].Swap(0)
	}
	return m.writtenLedger.Take(t, live)
}

// ForgetWritten clears every reader's record of the VMM's writes (after
// loading a boot image, whose pages no snapshot or fork needs as written).
func (m *Memory) ForgetWritten() {
	for t := Tracker(0); t < numTrackers; t++ {
		m.TakeWritten(t)
	}
}

// MarkPageWritten records that the VMM wrote flat page p (memfd offset /
// PageSize, as TakeWritten counts) through Flat, which MarkWritten's
// callers do not use: a rollback rewriting memory in place. Pages past the
// end are ignored. Safe for concurrent use.
func (m *Memory) MarkPageWritten(p uint64) {
	if p/64 >= uint64(len(m.written)) {
		return
	}
	w := &m.written[p/64]
	if bit := uint64(1) << (p % 64); w.Load()&bit == 0 {
		w.Or(bit)
	}
}
