package guestmem

// Giving guest memory back to the host.
//
// A balloon device (devices/virtio/balloon) learns from the guest which of
// its pages are free (pages it inflated the balloon with, and free blocks
// it reports) and hands them to Discard, which frees the host memory
// behind them. What a discarded page reads as afterwards depends on the
// mapping, and either is fine for a page the guest holds free:
//
//   - a MAP_SHARED memfd that was never forked (New): the pages are punched
//     out of the memfd (fallocate PUNCH_HOLE, KEEP_SIZE) and read back as
//     zeros; the memfd's blocks are freed, and a full snapshot skips the
//     holes (Populated);
//   - a private copy-on-write mapping of layers (NewPrivateFile,
//     NewFromBase, any Memory after Fork): the pages' private copies are
//     dropped (madvise MADV_DONTNEED) and the pages read back as their
//     layer's content. The layers themselves are immutable and never
//     written (fork.go), so a private Memory never punches its files.
//
// Either way KVM's MMU notifier unmaps the pages from the guest, which
// faults them in again when it touches them.
//
// Write records. Discard forgets the VMM's record of writes to the pages
// it discards (MarkWritten's live bits; what a reader has already taken
// stays in its Ledger share): their content no longer matters, and the
// virtio core marks every device-writable buffer a device pops, which for
// free page reporting is the very memory being given back, so that the
// next incremental snapshot or fork would otherwise read (and, from a
// memfd, allocate again) all of it. Neither does Discard add to any
// record: a snapshot taken afterwards may hold a discarded page's older
// content, which is fine for a page free in the guest at that snapshot; a
// rollback compares content (Populated); a fork copies the pages written
// since the last fork as they read then. KVM's dirty log still names the
// pages the guest wrote before it freed them.
//
// Discard is safe while vCPUs run (the guest does not use free pages), but
// like every device access it must not race with Fork, which changes the
// mapping: devices call it inside their service passes, which a fork's
// quiesce holds.

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Discard frees the host memory behind the whole pages of guest-physical
// [gpa, gpa+n); partial pages at either end are kept. The range must lie
// inside one region of RAM (not in, nor across, the MMIO hole), else the
// error wraps ErrOutOfRange and nothing is discarded. See the file comment
// for what discarded pages read as.
func (m *Memory) Discard(gpa, n uint64) error {
	if m.mem == nil {
		return errors.New("guestmem: discard: memory is closed")
	}
	off, ok := m.flatOffset(gpa, n)
	if !ok {
		return fmt.Errorf("guestmem: discard [%#x, +%#x): %w", gpa, n, ErrOutOfRange)
	}
	if err := m.discardFlat(off, n); err != nil {
		return fmt.Errorf("guestmem: discard [%#x, +%#x): %w", gpa, n, err)
	}
	return nil
}

// DiscardSlice is Discard for b, host bytes of guest RAM as Slice returned
// them (a buffer of a virtio chain, whose guest address the device is not
// told): the whole pages of b are discarded. A b that is not inside m's
// mapping is refused (ErrOutOfRange) and nothing is discarded.
func (m *Memory) DiscardSlice(b []byte) error {
	if m.mem == nil {
		return errors.New("guestmem: discard: memory is closed")
	}
	if len(b) == 0 {
		return nil
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || uint64(p-base) > uint64(len(m.mem)) || uint64(len(b)) > uint64(len(m.mem))-uint64(p-base) {
		return fmt.Errorf("guestmem: discard %d bytes at host %#x: not guest RAM: %w", len(b), p, ErrOutOfRange)
	}
	off := uint64(p - base)
	if err := m.discardFlat(off, uint64(len(b))); err != nil {
		return fmt.Errorf("guestmem: discard flat [%#x, +%#x): %w", off, len(b), err)
	}
	return nil
}

// discardFlat discards the whole pages of flat image [off, off+n), which
// is inside the mapping, and forgets the VMM's writes to them.
func (m *Memory) discardFlat(off, n uint64) error {
	lo := (off + PageSize - 1) &^ (PageSize - 1)
	hi := (off + n) &^ (PageSize - 1)
	if hi <= lo {
		return nil
	}
	if m.private {
		if err := unix.Madvise(m.mem[lo:hi], unix.MADV_DONTNEED); err != nil {
			return fmt.Errorf("madvise: %w", err)
		}
	} else if err := unix.Fallocate(m.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(lo), int64(hi-lo)); err != nil {
		return fmt.Errorf("fallocate: %w", err)
	}
	m.forget(lo, hi-lo) // a Pager (SetPager) installs them again when next needed
	for p := lo / PageSize; p < hi/PageSize; {
		w := p / 64
		if w >= uint64(len(m.written)) {
			break
		}
		// The bits of pages [p, min(end of word, hi)) in word w.
		end := min((w+1)*64, hi/PageSize)
		mask := ^uint64(0) >> (64 - (end - p)) << (p % 64)
		if m.written[w].Load()&mask != 0 {
			m.written[w].And(^mask)
		}
		p = end
	}
	return nil
}

// flatOffset translates guest [gpa, gpa+n) to its offset in the flat
// image (memfd offset); ok is false unless the range lies inside one
// region. n may be zero.
func (m *Memory) flatOffset(gpa, n uint64) (off uint64, ok bool) {
	for _, r := range m.regions {
		if gpa >= r.GPA && gpa < r.End() && n <= r.End()-gpa {
			return r.Offset + (gpa - r.GPA), true
		}
	}
	return 0, false
}
