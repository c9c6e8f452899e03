// Package vmmproc is the VMM process's side of Warren: the code that runs
// inside one `warren run`, `warren restore` or `warren fork-child` process
// (and its jail-init), as opposed to the daemon (hostd) or the guest
// (guestinit). Its pieces: vmmproc/jail (the VMM's hardening: namespaces,
// pivot_root, uid, capabilities, seccomp; jail-init and its privileged
// helper), vmmproc/egress (one sandbox's egress services: filter,
// resolver, proxy, audit) and vmmproc/credproxy (the credential-injecting
// proxy those services run). The process itself (building the VM, its
// control API, snapshots, forks) is still in cmd/warren/cli (issue 17).
//
// The name says which process the code runs in: "vmm" is already the
// virtual machine monitor's core (vCPUs, memory, buses), a library with no
// process of its own; vmmproc is the process around it, the one the daemon
// starts and reaches through vmmctl.
//
// May import: vmmctl (the control contract it serves), agentclient and
// agentwire (the guest agent's host end and wire contract), cow, memsnap,
// ebpf, image, vmm, devices and internal; not hostd, cmd or bench
// (internal/layout checks it). It ranks with vmmctl and agentclient, below
// hostd, which may import it (the daemon prepares jails and egress for
// the VMMs it starts).
package vmmproc
