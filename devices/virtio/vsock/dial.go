package vsock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// maxHandshakeLine bounds the CONNECT and OK lines of the host-side
// handshake, newline included.
const maxHandshakeLine = 32

// Dial connects to the guest's port through the device's unix socket at
// udsPath (Firecracker's hybrid model): it writes "CONNECT <port>\n" and
// reads the device's "OK <hostport>\n" answer. The returned net.Conn
// carries the stream that follows (nothing past the OK line is read), and
// is a *net.UnixConn, so CloseWrite half-closes the stream towards the
// guest.
//
// ctx bounds the handshake only; once Dial returns, the connection has no
// deadline. When the device closes the socket without OK (nothing listens
// on the guest port, the guest did not answer in time, the device is
// gone), the error says so.
func Dial(ctx context.Context, udsPath string, port uint32) (net.Conn, error) {
	fail := func(err error) error {
		return fmt.Errorf("vsock: connect to guest port %d via %s: %w", port, udsPath, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", udsPath)
	if err != nil {
		return nil, fail(err)
	}
	// Unblock the handshake when ctx ends.
	done := make(chan struct{})
	watch := make(chan struct{})
	go func() {
		defer close(watch)
		select {
		case <-ctx.Done():
			c.SetDeadline(time.Unix(1, 0))
		case <-done:
		}
	}()
	_, err = handshake(c, port)
	close(done)
	<-watch
	if err == nil {
		err = ctx.Err() // the watcher may have set a deadline after success
	}
	if err != nil {
		c.Close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fail(fmt.Errorf("%w (%v)", ctxErr, err))
		}
		return nil, fail(err)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// handshake writes the CONNECT line and reads the OK line byte by byte,
// returning the host port the device allocated.
func handshake(c net.Conn, port uint32) (uint32, error) {
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		return 0, fmt.Errorf("write CONNECT: %w", err)
	}
	line, err := readLine(c, maxHandshakeLine)
	if err != nil {
		if errors.Is(err, errNoNewline) && len(line) == 0 {
			return 0, errors.New("device closed the connection without OK (no listener on the guest port, or the guest did not answer)")
		}
		return 0, fmt.Errorf("read OK line: %w", err)
	}
	rest, ok := strings.CutPrefix(line, "OK ")
	if !ok {
		return 0, fmt.Errorf("device answered %q, want OK <port>", line)
	}
	n, err := strconv.ParseUint(rest, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("device answered %q: bad port", line)
	}
	return uint32(n), nil
}

var errNoNewline = errors.New("connection closed before end of line")

// readLine reads one '\n'-terminated line of at most max bytes (newline
// included) one byte at a time, so nothing after it is consumed. The line
// is returned without its newline.
func readLine(c net.Conn, max int) (string, error) {
	var b [maxHandshakeLine]byte
	for n := 0; n < max && n < len(b); {
		m, err := c.Read(b[n : n+1])
		if m == 1 {
			if b[n] == '\n' {
				return string(b[:n]), nil
			}
			n++
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return string(b[:n]), errNoNewline
			}
			return string(b[:n]), err
		}
	}
	return "", fmt.Errorf("line longer than %d bytes", max)
}
