// Package agentstub is a hostile guest agent for tests: a unix socket
// that answers the VMM's hybrid-vsock CONNECT handshake (as
// vsock.Dial expects) and then serves HTTP the way a guest that wants to
// hurt the host would, so that tests of the agent client and of the
// daemon can check that nothing the guest sends grows the host's memory
// or holds a request forever.
package agentstub

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// Mode is how a Stub answers.
type Mode int

const (
	// Endless answers every request with 200 and a body that never
	// ends: a JSON array of ones, or zeros for a file download.
	Endless Mode = iota
	// Trickle answers every request with 200 and a JSON value that
	// never ends, a byte every 200 ms.
	Trickle
)

// Stub is a hostile agent listening on Path. It stops when the test ends.
type Stub struct {
	// Path is the unix socket to hand to agentclient.New, as a VM's
	// vsock socket.
	Path string
	sent atomic.Int64
	done chan struct{}
}

// Sent returns how many body bytes the stub has written so far.
func (s *Stub) Sent() int64 { return s.sent.Load() }

// Start starts a stub answering in mode m.
func Start(t testing.TB, m Mode) *Stub {
	var s *Stub
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		w.Header().Set(agentwire.ModeHeader, "644")
		w.Header().Set(agentwire.PidHeader, "1")
		w.WriteHeader(200)
		fl := w.(http.Flusher)
		chunk := []byte(strings.Repeat("1,", 16<<10))
		if r.Method == http.MethodGet && r.URL.Path == "/files" {
			chunk = make([]byte, 32<<10)
		} else {
			w.Write([]byte("["))
		}
		for {
			select {
			case <-s.done:
				return
			case <-r.Context().Done():
				return
			default:
			}
			p := chunk
			if m == Trickle {
				p = chunk[:1]
				time.Sleep(200 * time.Millisecond)
			}
			n, err := w.Write(p)
			s.sent.Add(int64(n))
			fl.Flush()
			if err != nil {
				return
			}
		}
	})
	s = StartHandler(t, h)
	return s
}

// StartHandler starts a stub that serves h behind the handshake.
func StartHandler(t testing.TB, h http.Handler) *Stub {
	t.Helper()
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "agentstub")
	if err != nil {
		t.Fatal(err)
	}
	s := &Stub{Path: filepath.Join(dir, "vsock"), done: make(chan struct{})}
	l, err := net.Listen("unix", s.Path)
	if err != nil {
		t.Fatal(err)
	}
	conns := Hybrid(l)
	srv := &http.Server{Handler: h}
	go srv.Serve(conns)
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() { close(s.done) })
		conns.Close()
		srv.Close()
		os.RemoveAll(dir)
	})
	return s
}

// Hybrid wraps l, a unix listener standing for a VMM's vsock socket, in
// Firecracker's hybrid-vsock handshake: each connection must first send
// "CONNECT <port>\n" (in at most 64 bytes) and is answered "OK <host
// port>\n"; Accept returns only connections past it. Close closes l.
func Hybrid(l net.Listener) net.Listener {
	h := &hybrid{l: l, ch: make(chan net.Conn), done: make(chan struct{})}
	go h.serve()
	return h
}

// hybrid is Hybrid's listener; done is closed (once) by Close.
type hybrid struct {
	l    net.Listener
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (h *hybrid) serve() {
	for {
		c, err := h.l.Accept()
		if err != nil {
			h.Close()
			return
		}
		go h.handshake(c)
	}
}

func (h *hybrid) handshake(c net.Conn) {
	br := bufio.NewReader(io.LimitReader(c, 64))
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "CONNECT ") {
		c.Close()
		return
	}
	fmt.Fprintf(c, "OK 1073741824\n")
	select {
	case h.ch <- c:
	case <-h.done:
		c.Close()
	}
}

// Accept returns the next handshaken connection.
func (h *hybrid) Accept() (net.Conn, error) {
	select {
	case c := <-h.ch:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and closes the wrapped listener.
func (h *hybrid) Close() error {
	h.once.Do(func() { close(h.done) })
	return h.l.Close()
}

// Addr is the wrapped listener's address.
func (h *hybrid) Addr() net.Addr { return h.l.Addr() }
