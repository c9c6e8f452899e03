// Package vmsnap takes and restores snapshots of whole running VMs: the
// machine state (vmm.State), every virtio transport's state, and guest
// memory as a memsnap layer, full or incremental, tied together by a
// checksummed state file.
//
// # On disk
//
// A snapshot called NAME in directory DIR is two files:
//
//	DIR/NAME.wstate            the state file (memsnap/statefile), written last
//	DIR/NAME.<unique>.wsnap    its memory layer (memsnap layer format)
//
// and, after a lazy restore, a cache of the flattened memory chain:
//
//	DIR/NAME.<top layer hash, 16 hex digits>.wraw   raw guest RAM, zero pages as holes
//
// <unique> is the creation time in nanoseconds and a random number, both in
// hexadecimal, so taking NAME again never touches the layer that the existing
// NAME.wstate points to. The layer is written and renamed into place first;
// the state file is then written to a temporary file, synced and renamed over
// NAME.wstate. A crash at any point therefore leaves the previous NAME.wstate
// and everything it refers to intact (at worst an unreferenced layer or a
// temporary file, atomicfile.IsTemp, remains).
//
// An incremental layer names its parent layer by content hash (memsnap
// resolves it among the *.wsnap files of the same directory), so an
// incremental snapshot must be written into its parent's directory, and
// retaking the parent's name does not break it.
//
// The state file's header fingerprint and every layer's Fingerprint are the
// host fingerprint (see Fingerprint). Its sections, all JSON:
//
//	"meta"     Meta: format version (MetaVersion), kind ("full" or
//	           "incremental"), snapshot name, parent snapshot name, creation
//	           time, and the caller's opaque run options (what rebuilds the
//	           devices: disks, tap, MAC, vsock path, CID)
//	"machine"  vmm.State (vCPUs, irqchip, PIT, clock, UART), as vmm.State.Marshal
//	"devices"  [{"name": ..., "state": virtio.TransportState}] in device order
//	"memory"   {"layer": file base name, "hash": hex content hash, "size": bytes}
//	"disks"    [{"index": I, "layer": "/abs/frozen", "chain": ["/abs/frozen", ..., "/abs/bottom"]}]:
//	           each writable disk's frozen layer (DiskLayer; MetaVersion 2 on)
//
// A version 1 snapshot (from before snapshots held disks) has no "disks"
// section; Load still reads it, with no disk layers (its disks reopen as
// its run options name them, and a rollback of a VM with writable disks to
// it is refused).
//
// # Taking
//
// Snapshotter.Take pauses the VM (vmm Pause: the vCPUs park and the device
// pause hooks quiesce the virtio workers), reads the machine and transport
// states, and copies the pages to capture into a host buffer: for a full
// snapshot every page the memfd holds (guestmem Populated) that is not
// zero; for an incremental one the pages in KVM's dirty log together with
// the pages the VMM's devices wrote (guestmem TakeWritten). Both dirty
// records are cleared in every snapshot's pause, so the next incremental one
// is relative to it. The VM then resumes, and compression and writing happen
// while it runs.
//
// A full snapshot of a running VM with dirty tracking on pre-copies: it
// clears KVM's dirty log, copies every populated page while the guest runs,
// and in the pause copies again only the pages in the dirty log and those
// the VMM wrote since the previous snapshot; the layer is written from the
// pre-copy overlaid with them. Its pause is then as short as an
// incremental one's.
//
// With Snapshotter.Disks, the same pause freezes the writable disks (see
// disks.go): their state at the snapshot's instant is a frozen cow/disk
// layer, recorded in the "disks" section, and the VM goes on in new
// overlays over them; a full snapshot then merges each disk's own layers
// (after the resume) and records the merged one. Rollback puts the disks
// back in the pause in which it loads the memory.
//
// # Restoring
//
// Load reads and checks everything before a VM exists: the state file's
// checksums and version, the host fingerprint ("incompatible CPU"), the
// memory chain (every layer opened and verified, parents found by hash, the
// top's hash equal to the recorded one), and the machine state. Snapshot
// Restore then builds the VM eagerly (the chain decoded into a fresh memfd)
// or lazily (the chain flattened once to the .wraw cache, mapped
// copy-on-write as guest RAM), and RestoreDevices loads every transport's
// state and calls each device's AfterRestore (the vsock device's transport
// reset, so the guest agent reconnects).
package vmsnap
