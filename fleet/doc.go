// Package fleet runs Warren over many hosts on the Kubernetes API.
//
// The parts: fleet/api/v1alpha1 holds the custom resources (group
// warren.dev: SandboxTemplate, Sandbox, SandboxWarmPool, SandboxClaim,
// SandboxSnapshot, SandboxFork, SandboxRollback and the cluster-scoped
// WarrenHost); fleet/controller places sandboxes on hosts, keeps warm
// pools full, hands sandboxes to claims and marks the sandboxes of hosts
// whose Lease expired Lost; hostd/kube is the host side, run by
// warren-hostd --kube, that registers its host, renews its Lease and
// reconciles the sandboxes assigned to it through the daemon's own API.
//
// May import: hostd (fleet/objstore seals with hostd/crypt's per-tenant
// keys), memsnap, internal; hostd/kube imports fleet's API types and
// controller helpers in turn (fleet ranks with hostd in internal/layout).
// The controller itself talks to hosts only through the Kubernetes API.
//
// A namespace is a tenant: the daemon's tenant of a sandbox is its
// namespace's name, so Kubernetes RBAC on namespaces is what keeps
// tenants apart.
package fleet
