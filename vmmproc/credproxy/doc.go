// Package credproxy is the host side of a sandbox's credentials: an
// HTTP(S) proxy that adds secrets the guest never holds to the guest's
// requests, each only for the hosts its credential is scoped to.
//
// The sandbox's resolver answers the names in the policy's credentials'
// Hosts with the proxy's address (the host end of the guest's tap), so
// the guest's requests to those hosts arrive here, on a TLS listener
// (usually port 443) or a plain HTTP one (port 80). For TLS the proxy
// terminates the connection with a leaf certificate minted for the SNI
// name by the sandbox's own CA (see CA), whose certificate alone is in
// the guest's trust store. It then:
//
//   - refuses (403, audited "not-steered") a host that is not a
//     credential host of the current policy; over TLS no certificate is
//     minted for it and the handshake fails. A Host header that differs
//     from the SNI name is refused (421);
//   - on the plain HTTP listener forwards nothing: a request carrying any
//     placeholder (headers, path or query) is refused (403, audited
//     "plaintext-credential"), any other request to a credential host is
//     redirected to https (308). No secret ever crosses the wire in
//     cleartext;
//   - replaces each placeholder of a credential scoped to the host with
//     the secret, read from the Store for every request (so rotation
//     takes effect at once), in the parts of the request the credential's
//     Substitute names: header values by default, the URL path, query and
//     the (streamed) body only where the policy says; a placeholder of a credential scoped elsewhere is forwarded
//     unchanged and audited ("placeholder-out-of-scope"). A secret the
//     store cannot give (or an empty one) refuses the request (502)
//     before anything is sent upstream;
//   - sends the request to the real host over verified TLS, always on
//     port 443 (the guest's Host port is ignored), with hop-by-hop
//     headers removed and no forwarding headers added. The proxy resolves
//     the host itself (Upstream.Resolve) and connects only to addresses
//     its policy.Guard allows, checked before the dial, in the dialer's
//     Control hook and on the connection: never loopback, link-local
//     (169.254.169.254), RFC 1918, CGNAT, ULA, multicast or the host's
//     own addresses, except the operator's allowance (Guard.Allow). A
//     credential host is a public DNS name (policy.CheckCredentialHost):
//     no IP literal, localhost, single label or internal suffix, and no
//     wildcard unless the operator allows it (Config.PolicyOptions);
//   - scrubs the response: every secret of the host's credentials (as
//     sent, and URL-escaped) is replaced with its placeholder in the
//     header names and values and, streaming, in the body and trailers.
//     Compression is negotiated by the proxy itself so the body is
//     scrubbed uncompressed; a response in an encoding the proxy cannot
//     undo is refused (502);
//   - writes one audit record per request (audit.SourceProxy): the
//     verdict, host, method, path (never the query), the credentials
//     substituted, the status and, for refusals, a reason.
//
// What the guest can observe: the CA certificate; the placeholders; the
// upstream's responses, with the secrets scrubbed; its own requests.
// What it never sees: a secret value, or the CA's private key (which stays
// on the host, persisted with CA.MarshalPEM so that a restored sandbox
// keeps trusting it).
//
// Limits and caveats. Request bodies are streamed to the upstream,
// substituted only for credentials whose Substitute has "body" (streamed
// through a replacer, never buffered; the length then changes, so the
// body goes chunked). Scrubbing matches the secret's bytes as sent
// and its URL escapings, also when split across writes or chunks; an
// upstream that echoes it transformed otherwise (base64, JSON escapes)
// is not caught. Protocol upgrades (WebSocket) and CONNECT are not
// proxied. Limits on header size, header read time, idle time and open
// connections keep a guest from exhausting the host; secret values are
// never written to audit records, errors or logs.
package credproxy
