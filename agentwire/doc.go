// Package agentwire is the Warren guest agent's wire contract: the format
// both ends of the agent's connections read, and nothing that runs on
// either. The guest's end (guestinit/agent: the agent's HTTP server and
// its re-sync loop) and the host's end (agentclient: the client and the
// re-sync service) both import it, so each type is declared once.
//
// The agent's HTTP/1.1 API, served in the guest on vsock port Port:
//
//	POST /exec             run a process; the response is a framed stream (see Frame*)
//	POST /kill?pid=N&signal=TERM   signal the process group of a running /exec process
//	GET  /health           uptime, load, memory, agent version, re-syncs (JSON Health);
//	                       the handler's own time in the AgentTimeHeader header
//	GET  /files?path=P     the file's bytes; its mode in the X-Warren-Mode header
//	PUT  /files?path=P&mode=0644   replace the file with the request body
//	GET  /stat?path=P      JSON FileInfo (lstat)
//	GET  /list?path=P      JSON []FileInfo of a directory, sorted by name
//	POST /services         start a supervised service (JSON ServiceSpec; 201, its ServiceStatus)
//	GET  /services[?name=N]  JSON []ServiceStatus sorted by name, or one ServiceStatus
//	DELETE /services?name=N  stop a service; its final ServiceStatus
//
// Every failure before a stream starts is a JSON Error body with a matching
// HTTP status.
//
// The /exec request body is one JSON ExecRequest line; when Stdin is true
// the rest of the body is copied to the process's standard input.
//
// The /exec response is a sequence of frames: one byte of frame type, four
// bytes of big-endian payload length, then the payload (WriteFrame,
// ReadFrame). FrameStdout and FrameStderr carry output; the stream ends
// with exactly one FrameExit (JSON ExitStatus) or FrameError (JSON Error).
// The response header PidHeader carries the process's pid for POST /kill.
//
// The clock and RNG re-sync protocol (the guest dials the host's SyncPort
// and reads one SyncMessage line) is described in sync.go; ParseSyncMessage
// checks everything a line holds, since the guest trusts only what it
// checked.
//
// May import: internal only. Guest code (guestinit) and every host group
// may import it (internal/layout's Contracts; its test checks both).
package agentwire
