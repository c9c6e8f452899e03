// Package agentclient is the host's end of the Warren guest agent: the
// typed Client of the agent's HTTP API (whose types are agentwire's),
// reached through a VM's vsock unix socket (New: Firecracker's hybrid
// model, a CONNECT to the agent's guest port) or through any DialFunc
// (NewDial); and the host side of the clock and RNG re-sync protocol
// (SyncService, ServeSync), which the VMM process serves on
// agentwire.SyncPort. The guest's end is guestinit/agent. Copy
// (copy.go) is `warren cp`'s copying between the host and a guest, host
// side included (OpenCopySource, WriteHostCopy), which hostd/client's
// copies through the daemon share.
//
// A VM is addressed by the path of its vsock unix socket (`warren run
// --vsock PATH`); warren-hostd reaches its sandboxes' agents through this
// package. Every reply the client reads is bounded in size and time: the
// guest is not trusted (see Client, and agentstub for the hostile agent
// its tests use).
//
// Why a group of its own, at the VMM process's rank (with vmmctl, below
// hostd): the client is called by the daemon, the CLI and the benchmarks,
// and the re-sync service is served by the VMM process itself (vmmproc,
// of the same rank), so it
// sits below all of them; it needs nothing but agentwire and
// devices/virtio/vsock.
//
// May import: agentwire, devices, vmm and internal (and, by its rank,
// cow, memsnap, ebpf, image and vmmctl, which it has no use for); not
// hostd, cmd, bench or guest code (internal/layout checks it).
package agentclient
