// Package hostd is the host daemon's side of Warren: hostd/daemon (the
// warren-hostd API, templates, sandboxes, supervision, tenants), hostd/store
// (its state directory), hostd/cgroup (per-sandbox limits), hostd/metrics
// (Prometheus), hostd/crypt (at-rest encryption under tenants' keys),
// hostd/wire (the API's request and reply bodies) and hostd/client (the
// API's Go client, which the warren CLI uses). See hostd/openapi.yaml for
// the API. What runs inside each VMM process (its jail, its egress
// services and credential proxy) is vmmproc, below hostd; the guest
// agent's client is agentclient, a group of its own below hostd, since
// the VMM process uses it too.
//
// May import: vmmproc (the VMM process's jail and egress pieces, which
// the daemon prepares for the VMMs it starts), vmmctl (the VMM control
// contract), agentclient (the guest agent's client) and agentwire (its
// wire contract), cow, memsnap, ebpf, image, vmm, devices, internal, and
// guestinit/imageconfig, and fleet (its API types, controller helpers and
// object store, for hostd/kube); not cmd or bench (internal/layout checks it).
// The daemon reaches VMMs as processes (`warren restore`, `warren
// jail-init`), never by running a VM in its own process.
package hostd
