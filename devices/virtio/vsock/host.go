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
	"sync"
	"syscall"
	"time"
)

// nReadBufs is how many read buffers (of MaxPayload bytes) each
// connection's reader has: it reads the next chunk while the worker still
// delivers the previous one, so a reader that handed over a chunk needs
// no word from the worker before it waits on its socket again.
const nReadBufs = 2

// readBufs recycles read buffers across connections.
var readBufs = sync.Pool{New: func() any { b := make([]byte, MaxPayload); return &b }}

// chunk is host data read and not yet sent to the guest: data is what is
// left of it, a suffix of the buffer buf (from readBufs).
type chunk struct {
	buf  *[]byte
	data []byte
}

// hostConn is the host side of one connection: its socket and the two
// goroutines doing the I/O the worker does not do itself.
//
// Ownership: every field is owned by the worker (whoever runs the
// session's service pass, see session.tryService). Read buffers
// move between the reader and the worker: the reader owns the one it
// took from free until its evRead hands it back; the worker owns those in
// chunks (and the one an evRead carries) until it sends them back on
// free. wbuf belongs to the writer goroutine from a writeMsg until its
// evWrote. The worker sends on wmsg only when the writer is idle
// (writing false), and on free only buffers it holds (free has room for
// all of them), so neither send blocks.
//
// Writes: the worker writes guest data (and the OK line) to the socket
// itself, without blocking (writeNow); only what the socket does not take
// at once goes to the writer goroutine, which blocks in Write until it is
// written. A connection never has more than one write in flight, so
// the bytes reach the socket in order.
type hostConn struct {
	s        *session
	key      Key
	sock     net.Conn
	raw      syscall.RawConn // the socket's fd, for writeNow; nil: every write goes to the writer
	client   bool            // a host client that connected through UDSPath
	hostPort uint32          // for the OK line

	free chan *[]byte  // empty read buffers for the reader (capacity nReadBufs)
	wmsg chan writeMsg // write this, then report
	quit chan struct{} // closed by closeHost

	// wbuf holds the data of the writer's write (allocated on first use).
	wbuf []byte
	// chunks is host data read and not yet sent to the guest, oldest
	// first; at most nReadBufs (their backing array never grows).
	chunks  []chunk
	writing bool
	// readErr is the reader's final error (io.EOF at end of stream),
	// applied to the Conn once every chunk before it is sent (readDone).
	readErr  error
	readDone bool
	// okSent: the OK line was written or handed to the writer (host
	// clients only).
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
		free: make(chan *[]byte, nReadBufs), wmsg: make(chan writeMsg, 1), quit: make(chan struct{}),
		chunks: make([]chunk, 0, nReadBufs)}
	if sc, ok := sock.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			hc.raw = raw
		}
	}
	for range nReadBufs {
		hc.free <- readBufs.Get().(*[]byte)
	}
	go hc.reader()
	go hc.writer()
	return hc
}

// pending is the host data to send to the guest next (worker only).
func (hc *hostConn) pending() []byte {
	if len(hc.chunks) == 0 {
		return nil
	}
	return hc.chunks[0].data
}

// sent drops the first n bytes of pending, giving a drained buffer back
// to the reader (worker only).
func (hc *hostConn) sent(n uint32) {
	c := &hc.chunks[0]
	c.data = c.data[n:]
	if len(c.data) > 0 {
		return
	}
	hc.free <- c.buf
	copy(hc.chunks, hc.chunks[1:])
	hc.chunks[len(hc.chunks)-1] = chunk{}
	hc.chunks = hc.chunks[:len(hc.chunks)-1]
}

// write hands m to the idle writer goroutine (worker only).
func (hc *hostConn) write(m writeMsg) {
	hc.writing = true
	hc.wmsg <- m
}

// writeNow writes p to the socket without blocking (worker only, with the
// writer idle, so nothing is in flight before p) and returns how many
// bytes the socket took: fewer than len(p), maybe none, when its buffer is
// full, and none when the socket gives no raw access. An error is the
// socket's failure.
func (hc *hostConn) writeNow(p []byte) (int, error) {
	if hc.raw == nil || len(p) == 0 {
		return 0, nil
	}
	var n int
	var werr error
	if err := hc.raw.Write(func(fd uintptr) bool {
		for {
			n, werr = syscall.Write(int(fd), p)
			if werr != syscall.EINTR {
				return true // never wait: what is left goes to the writer
			}
		}
	}); err != nil {
		return 0, err
	}
	switch {
	case werr == syscall.EAGAIN:
		return 0, nil
	case werr != nil:
		return 0, werr
	}
	return max(n, 0), nil
}

// send writes data (guest data, or the OK line when ctl) to the socket:
// what the socket takes at once here, the rest through the writer
// goroutine (worker only, with the writer idle). It returns how many bytes
// were written here; the writer's share is reported by its evWrote.
func (hc *hostConn) send(data []byte, ctl bool) (int, error) {
	n, err := hc.writeNow(data)
	if err != nil || n == len(data) {
		return n, err
	}
	rest := data[n:]
	if hc.wbuf == nil {
		hc.wbuf = make([]byte, MaxPayload)
	}
	m := copy(hc.wbuf, rest)
	hc.write(writeMsg{data: hc.wbuf[:m], ctl: ctl})
	return n, nil
}

// reader reads host data into a free buffer at a time and reports it; it
// returns after an error or when the connection is closed.
func (hc *hostConn) reader() {
	for {
		var b *[]byte
		select {
		case b = <-hc.free:
		case <-hc.quit:
			return
		}
		n, err := hc.sock.Read(*b)
		hc.s.postInline(event{kind: evRead, hc: hc, buf: b, n: n, err: err})
		if err != nil {
			return
		}
	}
}

// writer performs one writeMsg at a time and reports it; it returns after
// an error or when the connection is closed.
func (hc *hostConn) writer() {
	for {
		var m writeMsg
		select {
		case m = <-hc.wmsg:
		case <-hc.quit:
			return
		}
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
		if err != nil {
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
	for _, c := range hc.chunks {
		readBufs.Put(c.buf)
	}
	hc.chunks = nil
	close(hc.quit)
	for drained := false; !drained; {
		select {
		case b := <-hc.free:
			readBufs.Put(b)
		default:
			drained = true // the reader holds the rest; closed events give them back
		}
	}
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
