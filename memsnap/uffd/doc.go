// Package uffd restores guest memory on demand with userfaultfd(2), as
// Firecracker and E2B do: the restored VM's RAM is an ordinary memfd
// (guestmem.New, MAP_SHARED, all holes at first), registered with a
// userfaultfd in MISSING mode before any vCPU runs, and a Server fills each
// page the first time anyone touches it, straight from the memsnap chain.
//
// # Serving
//
// A fault on page p is served from the chunk of the topmost layer that
// holds p (memsnap.Pages): the chunk is decoded (and kept in a small LRU of
// decoded chunks), and every visible page of it that is not populated yet
// is installed with UFFDIO_COPY, one ioctl per contiguous run, the run
// holding p first; a page the chain holds as zero gets UFFDIO_ZEROPAGE (or
// a copy of zeros should the kernel refuse ZEROPAGE), together with the
// other zero pages not yet populated in its aligned window of
// Options.ZeroBatch pages (a guest touching free memory touches runs of
// it; each fault costs a round trip through the handler). A bitmap records the
// pages installed; every fault is served even for a page marked populated
// (it may have been discarded since, by a balloon): a copy that finds the
// page present (EEXIST) is followed by UFFDIO_WAKE. Everything read from
// the layers is bounded by their indexes (vmsnap.Load verified the chain
// before any VM existed) and every chunk is checked against its SHA-256 as
// it is decoded.
//
// With Options.Prefetch, a prefetch goroutine walks a recorded working set
// (WorkingSet) in order and installs, chunk by chunk, the pages not yet
// populated while the guest already runs. With Options.Record, the pages
// served on demand (the faulting pages and those Ensure installed, not
// the neighbours copied with them nor prefetched ones) are recorded in first-fault order until
// TakeWorkingSet.
//
// Complete installs every remaining page that holds data and unregisters
// the memory: the memfd is then an ordinary one, which a fork may turn into
// a layer other processes map (a read fault there on an unpopulated hole
// would otherwise allocate a zero page behind the server's back) and whose
// holes (SEEK_DATA, guestmem Populated) are exactly its zero pages, as full
// snapshots and rollbacks assume. Pages the chain holds as zero stay holes.
//
// # Ownership, goroutines and locks
//
//   - The Server owns the userfaultfd, its stop eventfd and the chain given
//     to Start; Close (or Complete, for the descriptors and the chain)
//     releases them. The caller owns the memory and must keep it mapped
//     until Close; it closes the Server before unmapping it (vmmproc closes
//     it before the VM).
//   - The handler goroutine, locked to its OS thread, is the only reader of
//     the userfaultfd; it polls it and the stop eventfd, and serves each
//     fault message in turn. The prefetch goroutine (Options.Prefetch),
//     Complete's caller and Ensure's callers (VMM goroutines about to
//     touch guest memory) also install pages. No goroutine of the Server ever
//     loads or stores guest memory itself: pages are written only by the
//     kernel, through the ioctls, from Go-heap buffers.
//   - Server.mu guards changes to the populated bitmap (its words are
//     atomics, which Ensure reads without the lock), the chunk cache, the
//     working-set record and the completed and closed flags; whoever issues
//     UFFDIO_COPY or UFFDIO_ZEROPAGE holds it, so the bitmap is exact and a
//     demand fault waits at most for one chunk's copies by the prefetcher
//     (which decodes its chunks outside the lock, registered in
//     Server.decoding: a demand for a chunk being decoded releases the
//     lock and waits for that decode rather than decoding it twice). The counters (Stats) are
//     atomics, read without the lock.
//
// # A hazard of serving in-process, and the pager that avoids it
//
// A fault taken in user mode by another goroutine of this process (a
// virtio device copying to or from a page not yet populated) would block
// that goroutine's thread, with its P, until the handler served it; KVM's
// faults (vCPU threads in KVM_RUN) block inside a system call and hold no
// P. If every P were held by such blocked goroutines, or a stop-the-world
// (GC) waited for one blocked in runtime code that cannot be preempted
// (memmove), the handler could not run and the process would deadlock. Go
// offers no way to run the handler without a P.
//
// So VMM code does not fault: the Server is the guestmem.Pager of the
// memory it serves (vmsnap.RestoreWith sets it before any device exists),
// and guestmem's accessors that hand guest memory to VMM code (Slice,
// ReadAt, WriteAt: every virtio ring, descriptor and buffer access goes
// through Slice, devices/virtio/queue.go, and so do the balloon's checks)
// first call Server.Ensure for the flat range, across the MMIO hole as
// the regions map it. Ensure checks each page's bit in the populated
// bitmap without the lock (one atomic load a page: a few nanoseconds for
// a ring field or a 64 KiB buffer, BenchmarkEnsurePopulated) and serves
// the pages not populated as a demand fault would, in the calling
// goroutine, under Server.mu: the UFFDIO_COPY and UFFDIO_ZEROPAGE ioctls
// are system calls, during which the runtime can take the P away, so
// nothing waits in a fault holding one. A bit is set only after the ioctl
// installed its page, so a set bit means a present page. A balloon
// discard punches pages out of the memfd, which makes them missing again:
// guestmem.Memory.Discard then calls Server.Forget, which clears their
// bits, so that the next Ensure installs them again (as the chain holds
// them: the guest held them free). The pages Ensure installs are counted
// (Stats.EnsuredPages) and recorded in the working set like faults. The
// balloon's inflate check and its free-page reports also reach their pages
// through Slice, so Ensure installs pages that are discarded right after:
// correct, at the cost of decoding them.
//
// What may still fault in Go code, and why each is safe or rare:
//
//   - A page discarded while a device uses it: between Ensure's check and
//     the access, or between the punch and Forget. The guest discards
//     only pages it holds free, so only a guest that frees buffers it
//     gave a device meets it; the fault is then served as any other (the
//     handler serves a page marked populated too), and the deadlock needs
//     a stop-the-world in that window.
//   - guestmem.Memory.Flat, which hands out the whole mapping without
//     asking the pager. Its users: uffd.Start (only the address, to
//     register); an eager restore and a rollback (they write the memory,
//     after Complete for a rollback); a full snapshot and its pre-copy
//     (after Complete: vmmproc completes the memory first, so nothing is
//     registered any more); a fork's copy (after Complete too); and an
//     incremental snapshot's capture and pre-copy, which read the pages in
//     KVM's dirty log and the VMM's write record. Those were populated
//     when written (a guest write faults them in through KVM; a VMM write
//     went through Slice or WriteAt), unless a balloon discarded them
//     since: Discard forgets the VMM's write record of the pages it
//     discards, but KVM's dirty log still names a page the guest wrote
//     before it freed it, and the capture's read of such a page faults in
//     Go code (served by the handler, with the chain's content). Code
//     reading Flat can close that window by calling
//     guestmem.Memory.Ensure on the runs it is about to copy.
//   - guestmem.Memory.Host, which only KVM uses (its memory slots).
//   - A mapping replaced by a Fork (the memory completed first: Ensure
//     then answers at once) or the server closed (the memory is an
//     ordinary memfd again: a page never served reads as zeros).
//
// Serving from a separate process (the userfaultfd passed to it, as
// Firecracker's handler is), which this package's Server would run
// unchanged, would remove the hazard altogether.
//
// # Host requirements
//
// userfaultfd(2) without UFFD_USER_MODE_ONLY (KVM's faults are kernel-mode
// faults), which needs CAP_SYS_PTRACE when vm.unprivileged_userfaultfd is
// 0, or else a readable and writable /dev/userfaultfd (USERFAULTFD_IOC_NEW,
// Linux 6.1+); UFFD_FEATURE_MISSING_SHMEM (Linux 4.11+); and a registration
// that offers UFFDIO_COPY and UFFDIO_ZEROPAGE. Start reports any missing
// piece in one error wrapping ErrUnsupported, so the caller can fall back
// to another restore.
package uffd
