// Package agent is the Warren guest agent's HTTP/1.1 API: a server that
// runs inside the guest (PID 1 serves it on vsock port Port) and a client
// the host uses to reach it; and the clock and RNG re-sync protocol
// (ServeSync on the host, Syncer in the guest; see SyncMessage).
//
// The server works on any net.Listener; the client dials through a
// caller-supplied function, so both can be exercised on the host over a
// unix socket.
//
// Endpoints:
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
// bytes of big-endian payload length, then the payload. FrameStdout and
// FrameStderr carry output; the stream ends with exactly one FrameExit
// (JSON ExitStatus) or FrameError (JSON Error). The response header
// PidHeader carries the process's pid for POST /kill.
//
// Processes are started and reaped through a Waiter (see Waiter for the
// invariant that makes this race-free under PID 1's reaper).
package agent
