// Package mcpserver is Warren's Model Context Protocol server (`warren
// mcp`): it gives an MCP client (an LLM agent such as Claude Desktop) tools
// to create, run commands in, read and write the files of, pause, fork,
// snapshot, roll back and delete warren-hostd's sandboxes, as one tenant of
// one daemon.
//
// The server holds no state of its own: every tool call is one or a few
// calls of the daemon's API through a Daemon (in production a
// *client.Client; tests give a recording fake). It serves over stdio
// (ServeStdio) or streamable HTTP behind a bearer token (Handler,
// Listen, ServeHTTP: transport.go). The tools are grouped by what they act on:
// sandboxes.go (templates and the sandbox lifecycle), exec.go (commands
// and background processes) and files.go (guest files). Output given to the
// client is bounded (Limits): an LLM's context is small, and a guest's
// output is the guest's to choose.
//
// May import: hostd/client and hostd/wire (it is a client of the daemon's
// API, never the daemon), agentwire, internal; not cmd or bench
// (internal/layout checks it). cmd/warren/cli wires it as `warren mcp`.
package mcpserver
