// Package ebpf holds the sandbox egress policy, enforced on the host side
// of each sandbox's tap: ebpf/policy (the policy model and its compiled
// longest-prefix table), ebpf/filter (the eBPF program on the tap's ingress
// hook, its maps and audit events), ebpf/dnsgate (the per-sandbox resolver
// that answers only allowed names and opens their addresses for their TTL)
// and ebpf/audit (the rate-limited JSON-lines audit log). The credential
// proxy lives in vmmproc/credproxy and the whole per-sandbox service in
// vmmproc/egress. See ebpf/README.md.
//
// May import: vmm, devices, internal. Not hostd, cmd, bench or guest
// code (internal/layout checks it).
package ebpf
