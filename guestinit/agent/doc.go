// Package agent is the Warren guest agent's guest side: the HTTP/1.1
// server that runs inside the guest (PID 1 serves it on vsock port
// agentwire.Port) and the Syncer, the guest side of the clock and RNG
// re-sync protocol (it dials the host's agentwire.SyncPort and applies
// each agentwire.SyncMessage: the clock, entropy, a fork's identity, the
// egress trust store and placeholders).
//
// The endpoints, the request and reply types and the /exec stream's
// frames are package agentwire's, the contract both ends import; the
// host's end (the client and the re-sync service) is package agentclient.
// Nothing here runs on the host, but tests: the server works on any
// net.Listener, so its tests serve it over a unix socket and call it with
// agentclient's client.
//
// Every failure before a stream starts is a JSON agentwire.Error body with
// a matching HTTP status (errorFrom). Processes are started and reaped
// through a Waiter (see Waiter for the invariant that makes this race-free
// under PID 1's reaper).
package agent
