// Package hostd is the host daemon's side of Warren: hostd/daemon (the
// warren-hostd API, templates, sandboxes, supervision, tenants), hostd/store
// (its state directory), hostd/cgroup (per-sandbox limits), hostd/metrics
// (Prometheus), hostd/crypt (at-rest encryption under tenants' keys),
// hostd/jail (VMM process hardening), hostd/egress and hostd/credproxy (a
// sandbox's egress services), hostd/agentclient (the guest agent's client),
// hostd/wire (the API's request and reply bodies) and hostd/client (the
// API's Go client, which the warren CLI uses). See hostd/openapi.yaml for
// the API.
//
// May import: vmmctl (the VMM control contract), cow, memsnap, ebpf,
// image, vmm, devices, internal, and
// guestinit/agent and guestinit/imageconfig; not cmd or bench
// (internal/layout checks it). The daemon reaches VMMs as processes
// (`warren restore`, `warren jail-init`), never by importing the VMM.
package hostd
