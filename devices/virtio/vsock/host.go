package vsock

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hostConn is the host side of one connection: its socket and the two
// goroutines doing its I/O.
//
// Ownership: every field is owned by the worker goroutine, except that a
// buffer handed to a goroutine belongs to it until the goroutine's event
// comes back: rbuf from a grant until the evRead, wbuf (the data of a
// writeMsg) until the evWrote. The worker sends on grant and wmsg only
// when the goroutine is idle (reading, writing false), so a send always
// finds the one-slot channel empty and never blocks.
type hostConn struct {
	s        *session
	key      Key
	sock     net.Conn
	client   bool   // a host client that connected through UDSPath
	hostPort uint32 // for the OK line

	grant chan int      // read at most this many bytes, then report
	wmsg  chan writeMsg // write this, then report
	quit  chan struct{} // closed by closeHost

	rbuf, wbuf []byte
	// chunk is host data read and not yet sent to the guest (a prefix of
	// rbuf, shrinking from the front as it is sent).
	chunk   []byte
	reading bool
	writing bool
	// readErr is the reader's final error (io.EOF at end of stream),
	// applied to the Conn once chunk is sent (readDone).
	readErr  error
	readDone bool
	// okSent: the OK line was handed to the writer (host clients only).
	okSent bool
	// halfClosed: the writer was told the guest will send no more.
	halfClosed bool
	// bothShut: both directions are done on the host side and the Conn
	// was shut both ways.
	bothShut bool
	closed   bool

	connectDeadline time.Time // host clients: the guest must answer by then
	closeDeadline   time.Time // set on entering StateLocalClosed
}

// writeMsg is one job for a connection's writer goroutine.
type writeMsg struct {
	data       []byte
	closeWrite bool // half-close the socket (close it if it cannot)
	ctl        bool // not guest data: not consumed from the Conn
}

func newHostConn(s *session, k Key, sock net.Conn, client bool, hostPort uint32) *hostConn {
	hc := &hostConn{s: s, key: k, sock: sock, client: client, hostPort: hostPort,
		grant: make(chan int, 1), wmsg: make(chan writeMsg, 1), quit: make(chan struct{}),
		rbuf: make([]byte, MaxPayload), wbuf: make([]byte, MaxPayload)}
	go hc.reader()
	go hc.writer()
	return hc
}

// write hands m to the idle writer goroutine (worker only).
func (hc *hostConn) write(m writeMsg) {
	hc.writing = true
	hc.wmsg <- m
}

// reader reads one granted chunk at a time and reports it; it returns
// after an error or when the connection is closed.
func (hc *hostConn) reader() {
	serveEach(hc.quit, hc.grant, func(n int) error {
		m, err := hc.sock.Read(hc.rbuf[:n])
		hc.s.post(event{kind: evRead, hc: hc, n: m, err: err})
		return err
	})
}

// writer performs one writeMsg at a time and reports it; it returns after
// an error or when the connection is closed.
func (hc *hostConn) writer() {
	serveEach(hc.quit, hc.wmsg, func(m writeMsg) error {
		var err error
		if m.closeWrite {
			if cw, ok := hc.sock.(interface{ CloseWrite() error }); ok {
				err = cw.CloseWrite()
			} else {
				err = hc.sock.Close()
			}
		} else {
			_, err = hc.sock.Write(m.data)
		}
		hc.s.post(event{kind: evWrote, hc: hc, n: len(m.data), err: err, ctl: m.ctl})
		return err
	})
}

// serveEach calls do with each request received from reqs, one at a time,
// until do fails or quit is closed.
func serveEach[T any](quit <-chan struct{}, reqs <-chan T, do func(T) error) {
	for {
		select {
		case r := <-reqs:
			if do(r) != nil {
				return
			}
		case <-quit:
			return
		}
	}
}

// closeHost closes a connection's host socket and stops its goroutines
// (worker only). Events they still post are ignored.
func (s *session) closeHost(hc *hostConn) {
	if hc.closed {
		return
	}
	hc.closed = true
	hc.chunk = nil
	close(hc.quit)
	hc.sock.Close()
	delete(s.hosts, hc.key)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// socketPair returns the two ends of a connected unix stream socket pair.
func socketPair() (a, b net.Conn, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("vsock: socketpair: %w", err)
	}
	conv := func(fd int) (net.Conn, error) {
		f := os.NewFile(uintptr(fd), "vsock-service")
		defer f.Close()
		return net.FileConn(f)
	}
	a, err = conv(fds[0])
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("vsock: socketpair: %w", err)
	}
	if b, err = conv(fds[1]); err != nil {
		a.Close()
		return nil, nil, fmt.Errorf("vsock: socketpair: %w", err)
	}
	return a, b, nil
}

// Listen creates the unix socket at UDSPath for host clients and accepts
// on it until Close. A stale socket there is replaced; any other file is
// refused. Each client writes "CONNECT <port>\n" (at most 32 bytes,
// within a few seconds) and, once the guest accepts, reads "OK
// <hostport>\n" followed by the stream; a malformed line, a guest that
// refuses or does not answer in time, or no running device closes the
// client without OK. Dial is the client side.
func (d *Device) Listen() error {
	if d.UDSPath == "" {
		return errors.New("vsock: listen: no UDSPath")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ln != nil || d.closed {
		return fmt.Errorf("vsock: listen %s: already listening or closed", d.UDSPath)
	}
	if fi, err := os.Lstat(d.UDSPath); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return fmt.Errorf("vsock: listen %s: a file that is not a socket is in the way", d.UDSPath)
		}
		if err := os.Remove(d.UDSPath); err != nil {
			return fmt.Errorf("vsock: listen %s: remove stale socket: %w", d.UDSPath, err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: d.UDSPath, Net: "unix"})
	if err != nil {
		return fmt.Errorf("vsock: listen: %w", err)
	}
	ln.SetUnlinkOnClose(false) // Close removes it, once
	d.ln = ln
	d.lnDone = make(chan struct{})
	go d.acceptLoop(ln, d.lnDone)
	return nil
}

// Close stops accepting host clients, removes the socket and resets every
// connection (the guest gets RSTs, host sockets are closed). The device
// itself keeps running until the transport resets it; guest REQUESTs are
// still served by Services and <UDSPath>_<port> sockets.
func (d *Device) Close() error {
	d.mu.Lock()
	ln, done := d.ln, d.lnDone
	d.ln, d.closed = nil, true
	d.mu.Unlock()
	var err error
	if ln != nil {
		ln.Close()
		<-done
		if rerr := os.Remove(d.UDSPath); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = fmt.Errorf("vsock: close: %w", rerr)
		}
	}
	d.post(event{kind: evResetAll})
	return err
}

func (d *Device) acceptLoop(ln *net.UnixListener, done chan struct{}) {
	defer close(done)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		go d.handshake(c)
	}
}

// handshake reads a host client's CONNECT line and hands the client to
// the running session.
func (d *Device) handshake(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(d.timeouts.orDefault().handshake))
	port, err := readConnect(c)
	if err != nil {
		d.Metrics.ConnsRefused.Add(1)
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		c.Close()
		return
	}
	d.post(event{kind: evClient, c: c, port: port})
}

// readConnect reads and parses "CONNECT <port>\n".
func readConnect(c net.Conn) (uint32, error) {
	line, err := readLine(c, maxHandshakeLine)
	if err != nil {
		return 0, err
	}
	return parseConnect(line)
}

// parseConnect parses a CONNECT line without its newline: "CONNECT " and a
// decimal 32-bit port in canonical form (no sign, no leading zeros),
// nothing else.
func parseConnect(line string) (uint32, error) {
	arg, ok := strings.CutPrefix(line, "CONNECT ")
	if !ok {
		return 0, fmt.Errorf("bad handshake %q", line)
	}
	port, err := strconv.ParseUint(arg, 10, 32)
	if err != nil || strconv.FormatUint(port, 10) != arg {
		return 0, fmt.Errorf("bad port in %q", line)
	}
	return uint32(port), nil
}
