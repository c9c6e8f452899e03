// Package dnsgate is a sandbox's resolver on the host side: the only DNS
// server the guest can reach. It answers only the names the sandbox's egress
// policy allows, and reports every IPv4 address it answers with so that the
// eBPF filter (ebpf/filter) can allow that address, with the domain's
// protocol and ports, for as long as the answer lives.
//
// # Answers
//
//   - A credential host (policy.Policy.CredentialHost) is answered, for type
//     A, with the credential proxy's address (Config.ProxyAddr, TTL 60 s);
//     AAAA gets an empty NOERROR answer. The upstream is not asked. This
//     steers the guest's HTTPS for those hosts to the host's proxy.
//   - An allowed name (policy.Policy.Domain) of type A, AAAA (only when the
//     policy allows IPv6) or CNAME is forwarded to the upstream server (or
//     answered from Config.Static). Only the records on the CNAME chain from
//     the question's name are kept. Before the reply leaves, each IPv4
//     address in it is added to the allow table for its TTL, clamped to
//     [MinTTL, MaxTTL], and Config.OnChange has returned; the TTLs the guest
//     sees are never longer than the allow lasts. AAAA for an allowed name
//     when IPv6 is off gets an empty NOERROR answer without asking upstream.
//   - Other query types (MX, TXT, SRV, HTTPS, ...) for allowed names and
//     credential hosts get an empty NOERROR answer (NODATA), without asking
//     upstream.
//   - Every other name gets NXDOMAIN, audited as a deny with reason
//     "name-not-allowed". NXDOMAIN rather than REFUSED was chosen so that
//     stub resolvers fail fast ("host not found") instead of retrying other
//     servers.
//   - PTR queries, classes other than IN and zone transfers get REFUSED;
//     opcodes other than QUERY get NOTIMP; a query with other than one
//     question gets FORMERR.
//   - An upstream that fails or times out (2 s) gives SERVFAIL, audited.
//   - When the allow table is full (Config.MaxEntries, 4096 by default) an
//     answer that would add addresses gives SERVFAIL, audited with reason
//     "table-full", so a guest cannot grow the host's memory without bound.
//     Upstream queries in flight are capped too (SERVFAIL "busy").
//
// Addresses that are never a legitimate destination (policy.Reserved:
// unspecified, loopback, link-local with the clouds' metadata address,
// multicast, broadcast and reserved ranges, IPv6 forms embedding such an
// IPv4 address) and the host's own interface addresses are dropped from
// answers, and so are private ones (RFC 1918, RFC 6598, fc00::/7) unless
// Config.AllowPrivate is set: an allowed name cannot be used to rebind the
// guest onto the host or its networks (policy.Guard decides). Policy CIDR rules can still allow
// such ranges explicitly.
//
// # What the guest can and cannot learn
//
// The guest learns the addresses of the names it may reach (and their CNAME
// chains as the upstream returns them), and that credential hosts resolve
// to the proxy. By asking, it can tell which names the policy allows (they
// get NOERROR, or NXDOMAIN from the upstream when they do not exist; the
// others get NXDOMAIN from the gate), which its own policy tells it anyway.
// It cannot resolve any other name, make reverse (PTR) lookups, or use TXT,
// MX or other record types as a channel in or out. It never sees the
// upstream's authority or additional sections, records off the CNAME chain
// (a poisoned or chatty upstream cannot widen the allow set with them), or
// which upstream server the host uses.
//
// It can still send data out through the names it queries under an allowed
// wildcard ("<data>.example.com" reaches example.com's authoritative
// servers); a policy that needs to prevent this must list exact names.
//
// # Allow table
//
// Entries are keyed by (address, domain id) and keep the latest expiry seen.
// A timer removes expired entries; SetPolicy removes at once the entries of
// domains that are gone or whose protocol or ports changed. Each change of
// the set calls Config.OnChange with the whole current set (Gate.Hosts), one
// call at a time, outside the table's lock. State and Restore carry the
// table, with absolute expiry times, across a snapshot and restore.
package dnsgate
