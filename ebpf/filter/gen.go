// Package filter is a sandbox's eBPF egress filter: a tc classifier on the
// ingress hook of the sandbox's tap (the hook that sees guest -> host
// traffic) that lets a packet through only when the sandbox's
// infrastructure (ARP, DHCP, DNS to its resolver, the credential proxy) or
// the compiled egress policy (ebpf/policy) allows it, counts what it
// passes and drops, and reports its decisions as audit records.
//
// Each Filter loads its own program and maps (nothing is pinned), so one
// Filter serves one sandbox. The BPF C source is bpf/egress.c; the
// compiled object and its Go bindings (egress_bpfel.*) are generated with
// bpf2go (go generate, needs clang) and checked in. See ebpf/README.md.
package filter

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux -target bpfel -type config -type lpm_key -type allow_val -type port_rule -type counters -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" egress bpf/egress.c
