package mcpserver

// The transports: stdio (the MCP client runs `warren mcp` as its child)
// and streamable HTTP.
//
// The HTTP endpoint always requires a bearer token: whoever reaches it
// acts as the tenant on the daemon (runs commands in its sandboxes), so it
// must not be an open door even on loopback, where every local user and
// every web page's requests (DNS rebinding) could reach it. An address
// without a host listens on loopback only.

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ServeStdio serves one MCP session over r and w (a client's pipes: the
// process's stdin and stdout) until the client closes r or ctx ends.
func ServeStdio(ctx context.Context, s *mcp.Server, r io.Reader, w io.Writer) error {
	err := s.Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{w}})
	if ctx.Err() != nil || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// Path is where the HTTP handler serves the MCP endpoint.
const Path = "/mcp"

// sessionTimeout closes an HTTP session idle that long.
const sessionTimeout = 30 * time.Minute

// Handler returns the streamable HTTP handler of s at Path: every request
// must carry "Authorization: Bearer " + token (compared in constant time),
// else it is answered 401. token must not be empty.
func Handler(s *mcp.Server, token string, logger *slog.Logger) (http.Handler, error) {
	if token == "" {
		return nil, errors.New("the MCP HTTP endpoint needs a bearer token")
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{
		SessionTimeout: sessionTimeout,
		Logger:         logger,
	})
	mux := http.NewServeMux()
	mux.Handle(Path, requireToken(token, h))
	return mux, nil
}

// requireToken answers 401 to a request without the bearer token.
func requireToken(token string, h http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="warren mcp"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// NewToken returns a random token (32 bytes, hex) for an endpoint whose
// operator gave none.
func NewToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Listen listens on addr (HOST:PORT; a missing host is 127.0.0.1) and
// reports whether the address it listens on is a loopback one.
func Listen(addr string) (ln net.Listener, loopback bool, err error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, false, fmt.Errorf("listen address %q: want HOST:PORT or :PORT: %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err = net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, false, err
	}
	ip := ln.Addr().(*net.TCPAddr).IP
	return ln, ip.IsLoopback(), nil
}

// URL is the endpoint's URL for a listener on ln.
func URL(ln net.Listener) string {
	a := ln.Addr().String()
	if strings.HasPrefix(a, "[::]") || strings.HasPrefix(a, "0.0.0.0") {
		_, port, _ := net.SplitHostPort(a)
		a = net.JoinHostPort("localhost", port)
	}
	return "http://" + a + Path
}

// ServeHTTP serves h on ln until ctx ends, then shuts down (waiting up to
// 2 seconds for calls in progress; an open event stream never ends by
// itself).
func ServeHTTP(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		srv.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
