// Package vmmproc is the VMM process as a library: the code that runs
// inside one `warren run`, `warren restore` or `warren fork-child` process
// (and its jail-init), as opposed to the daemon (hostd) or the guest
// (guestinit). The package itself builds a VM with its devices (vm.go),
// serves its control API (api.go, the vmmctl contract), snapshots and
// restores it (snapshot.go: runOptions, the settings a snapshot records),
// forks it (fork.go), runs its egress services (egress.go) and enters
// its jail (jail.go); for jail-init it is the family's helper
// (familyhelper.go, nethelper.go). Its entry points are Run, Restore,
// ForkChild and JailInit (process.go); the warren and warren-vmm
// commands (cmd/internal/vmmverbs) parse their flags and print what they
// return.
//
// Its sub-packages: vmmproc/jail (the VMM's hardening: namespaces,
// pivot_root, uid, capabilities, seccomp; jail-init and its privileged
// helper), vmmproc/egress (one sandbox's egress services: filter,
// resolver, proxy, audit) and vmmproc/credproxy (the credential-injecting
// proxy those services run).
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
