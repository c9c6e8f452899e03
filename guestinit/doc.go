// Package guestinit is the guest's PID 1: it mounts the pseudo file systems,
// optionally moves into an image's root file system on a virtio-blk disk
// (warren.root), sets the hostname from the kernel command line, starts the
// guest agent, announces readiness on the console with one line, optionally
// powers the VM off, and otherwise reaps orphaned children forever.
//
// Everything that can be checked without a VM (command-line parsing, uptime
// parsing, the ready line) lives in small pure functions with tests; the
// system calls live in the linux-only files.
//
// Cost note: inside a Warren guest every page fault and syscall is emulated
// (see docs), so PID 1 keeps its work and its memory footprint minimal.
//
// May import: guestinit's own packages, agentwire (the guest agent's
// wire contract, which the host's agentclient reads too) and internal
// only: guest code imports no host code. Host code imports
// guestinit/imageconfig (the image builder's contract with PID 1) and
// nothing else of it (internal/layout checks both).
package guestinit
