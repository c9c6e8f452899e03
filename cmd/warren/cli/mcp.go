package cli

// warren mcp: the MCP server of package mcpserver, over stdio or HTTP, as
// the tenant the daemon flags name.

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/warrenvm/warren/mcpserver"
)

const mcpUsage = `mcp [--http [HOST]:PORT [--http-token TOKEN]]

Serves the Model Context Protocol to an LLM client: tools that create, run
commands in, read and write, pause, fork, snapshot, roll back and delete
the tenant's sandboxes. Over standard input and output by default (the
client runs warren mcp); with --http, streamable HTTP at
http://HOST:PORT/mcp (HOST defaults to 127.0.0.1), where every request
needs "Authorization: Bearer TOKEN": the token of --http-token, else
$WARREN_MCP_TOKEN, else a random one printed on standard error.`

// mcpCmd is warren mcp's setup.
func mcpCmd(d *daemonCmd) func() int {
	addr := d.fs.String("http", "", "serve streamable HTTP on [HOST]:PORT (HOST defaults to 127.0.0.1) instead of stdio")
	token := d.fs.String("http-token", "", "the bearer token HTTP clients must send ($WARREN_MCP_TOKEN; default: a random one, printed)")
	return func() int {
		logger := slog.New(slog.NewTextHandler(d.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		srv := mcpserver.New(d.c, mcpserver.Options{Logger: logger})
		if *addr == "" {
			if err := mcpserver.ServeStdio(d.ctx, srv, d.stdin, d.stdout); err != nil {
				return d.fail(err)
			}
			return 0
		}
		ln, loopback, err := mcpserver.Listen(*addr)
		if err != nil {
			return d.fail(err)
		}
		defer ln.Close()
		tok := *token
		if tok == "" {
			tok = os.Getenv("WARREN_MCP_TOKEN")
		}
		if tok == "" {
			tok = mcpserver.NewToken()
			fmt.Fprintf(d.stderr, "%s: bearer token (set --http-token or $WARREN_MCP_TOKEN to choose it): %s\n", d.name, tok)
		}
		h, err := mcpserver.Handler(srv, tok, logger)
		if err != nil {
			return d.fail(err)
		}
		if !loopback {
			fmt.Fprintf(d.stderr, "%s: warning: %s is not a loopback address: the bearer token crosses the network in clear text (plain HTTP); put TLS in front\n", d.name, ln.Addr())
		}
		fmt.Fprintf(d.stderr, "%s: serving %s\n", d.name, mcpserver.URL(ln))
		if err := mcpserver.ServeHTTP(d.ctx, ln, h); err != nil {
			return d.fail(err)
		}
		return 0
	}
}
