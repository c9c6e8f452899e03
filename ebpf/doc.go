// Package ebpf owns egress policy and traffic steering on a sandbox's tap with eBPF (the Egress policy issue).
//
// It is empty until that issue lands; the folder exists so the layout in
// README.md is visible from the start.
package ebpf
