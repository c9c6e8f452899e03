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
//   - replaces each placeholder of a credential scoped to the host with
//     the secret, read from the Store for every request (so rotation
//     takes effect at once), in header values and in the URL path and
//     query; a placeholder of a credential scoped elsewhere is forwarded
//     unchanged and audited ("placeholder-out-of-scope"). A secret the
//     store cannot give (or an empty one) refuses the request (502)
//     before anything is sent upstream;
//   - sends the request to the real host over verified TLS (plain HTTP
//     for the plain listener), with hop-by-hop headers removed and no
//     forwarding headers added;
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
// Limits and caveats. Request bodies are streamed to the upstream
// unchanged: placeholders in a body are not substituted (and the body
// is never buffered). Scrubbing matches the secret's bytes as sent
// and its URL escapings, also when split across writes or chunks; an
// upstream that echoes it transformed otherwise (base64, JSON escapes)
// is not caught. Protocol upgrades (WebSocket) and CONNECT are not
// proxied. Limits on header size, header read time, idle time and open
// connections keep a guest from exhausting the host; secret values are
// never written to audit records, errors or logs.
package credproxy
