// Package bench holds Warren's benchmarks, one command a folder
// (bench/boot, bench/devices, bench/agent, bench/snapshot, bench/fork,
// bench/egress, bench/hostd, bench/image), each measuring against a peer
// (QEMU -M microvm, or the same traffic without the feature) side by side
// in one run and printing p50/p90/p99 with JSON and PNG output, and their
// helpers (bench/stats, bench/benchplot, bench/qemu, bench/console,
// bench/vsockpeer, bench/agentdial, bench/proc, bench/rig). Results a
// reader should see are under bench/results with the command that made
// them.
//
// May import: anything of the module but cmd; nothing imports bench
// (internal/layout checks it).
package bench
