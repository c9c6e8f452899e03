//go:build linux && amd64

package jail

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The privileged helper: what a VMM family (a VMM and its fork children,
// under one RunInit) needs done with privileges after the VMM gave its own
// up. RunInit, which keeps root for the family's life, serves it on a
// unix SOCK_SEQPACKET socket whose other end the VMM inherits (its number
// in the environment, HelperEnv); the VMM gives it to its fork children.
//
// A request is one message: a payload of at most MaxHelperRequest bytes
// (the handler's own encoding) and its descriptors: first the requester's
// end of a fresh socket pair, on which the reply comes back as one message,
// then at most MaxHelperRequestFiles for the handler (a fork child's, for
// Spawner). The reply is
// a status byte (0: done, then the handler's reply; 1: refused, then why)
// and the descriptors the handler made (at most MaxHelperFiles). Each
// request has its own reply socket, so the processes of a family may call
// at once without reading each other's replies.
//
// The helper trusts nothing in a request: it is the one door from a
// confined (maybe subverted) VMM back to root. The handler decides what a
// payload may ask for; this transport bounds the sizes, serves at most
// helperWorkers requests at a time and drops a malformed message.

// HelperEnv names, in the VMM's environment (set by RunInit with a
// helper), the descriptor of its end of the helper socket.
const HelperEnv = "WARREN_JAIL_HELPER_FD"

const (
	// MaxHelperRequest bounds a request's payload.
	MaxHelperRequest = 64 << 10
	// MaxHelperFiles bounds the descriptors of one reply.
	MaxHelperFiles = 16
	// MaxHelperRequestFiles bounds the descriptors of one request, besides
	// its reply socket.
	MaxHelperRequestFiles = maxSpawnFiles
	// helperWorkers bounds the requests served at once.
	helperWorkers = 4
)

// HelperFunc serves one request with the descriptors that came with it
// (closed by the caller once it returns: what it keeps, it dups) from the
// process pid (the kernel's word, SCM_CREDENTIALS, in the helper's pid
// namespace; 0 where it gave none): it returns the reply payload and the
// files to hand over (closed by the caller once sent), or an error that
// the requester is told.
type HelperFunc func(req []byte, in []*os.File, pid int) (reply []byte, files []*os.File, err error)

// helperPair makes the helper's socket pair: ours (kept by RunInit) and
// the VMM's (inherited). Both close on exec; the VMM's is passed on
// explicitly. Ours has SO_PASSCRED: each request comes with its sender's
// pid, filled in by the kernel.
func helperPair() (ours, theirs *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("jail: helper socket: %w", err)
	}
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("jail: helper socket: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "helper"), os.NewFile(uintptr(fds[1]), "helper-vmm"), nil
}

// ServeHelper serves requests on conn with handle until conn's peer (every
// copy of it: the VMM and its fork children) is gone.
func ServeHelper(conn *os.File, handle HelperFunc) {
	sem := make(chan struct{}, helperWorkers)
	buf := make([]byte, MaxHelperRequest+1)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace((1+MaxHelperRequestFiles)*4))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(int(conn.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || (n == 0 && oobn == 0) {
			return // the peer is gone
		}
		fds := rightsOf(oob[:oobn])
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || len(fds) < 1 || len(fds) > 1+MaxHelperRequestFiles || n > MaxHelperRequest {
			for _, fd := range fds {
				unix.Close(fd)
			}
			continue // malformed: no reply socket to answer on, or too big
		}
		req := append([]byte(nil), buf[:n]...)
		pid := senderOf(oob[:oobn])
		replyFD := fds[0]
		in := make([]*os.File, len(fds)-1)
		for i, fd := range fds[1:] {
			in[i] = os.NewFile(uintptr(fd), "helper-request-"+strconv.Itoa(i))
		}
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			defer unix.Close(replyFD)
			out, files, err := handle(req, in, pid)
			closeAll(in)
			defer closeAll(files)
			msg, rights := []byte{0}, []int(nil)
			switch {
			case err == nil && len(files) > MaxHelperFiles:
				err = fmt.Errorf("%d descriptors, at most %d", len(files), MaxHelperFiles)
			case err == nil && len(out) > MaxHelperRequest:
				err = fmt.Errorf("a %d-byte reply, at most %d", len(out), MaxHelperRequest)
			}
			if err != nil {
				msg = append([]byte{1}, err.Error()...)
			} else {
				msg = append(msg, out...)
				for _, f := range files {
					rights = append(rights, int(f.Fd()))
				}
			}
			var cmsg []byte
			if len(rights) > 0 {
				cmsg = unix.UnixRights(rights...)
			}
			unix.Sendmsg(replyFD, msg, cmsg, nil, unix.MSG_NOSIGNAL)
		}()
	}
}

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// senderOf returns the pid of the SCM_CREDENTIALS message in oob, or 0.
func senderOf(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for i := range msgs {
		if c, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
			return int(c.Pid)
		}
	}
	return 0
}

// rightsOf returns the descriptors of the SCM_RIGHTS messages in oob.
func rightsOf(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// HelperFromEnv returns the helper socket the VMM inherited (HelperEnv),
// or nil when it has none.
func HelperFromEnv() (*os.File, error) {
	v := os.Getenv(HelperEnv)
	if v == "" {
		return nil, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("jail: $%s=%q is not a descriptor", HelperEnv, v)
	}
	t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || t != unix.SOCK_SEQPACKET {
		return nil, fmt.Errorf("jail: $%s=%d is not a helper socket (%v)", HelperEnv, fd, err)
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "helper"), nil
}

// CallHelper sends req with the descriptors of in (at most
// MaxHelperRequestFiles; the caller keeps its own) to the helper on conn
// and waits up to timeout for its reply: the payload and the descriptors
// it handed over (the caller owns them), or the helper's refusal as an
// error.
func CallHelper(conn *os.File, req []byte, in []*os.File, timeout time.Duration) ([]byte, []*os.File, error) {
	if len(req) > MaxHelperRequest {
		return nil, nil, fmt.Errorf("jail: helper request of %d bytes, at most %d", len(req), MaxHelperRequest)
	}
	if len(in) > MaxHelperRequestFiles {
		return nil, nil, fmt.Errorf("jail: helper request with %d descriptors, at most %d", len(in), MaxHelperRequestFiles)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("jail: helper: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "helper-reply")
	defer mine.Close()
	rights := []int{fds[1]}
	for _, f := range in {
		rights = append(rights, int(f.Fd()))
	}
	err = unix.Sendmsg(int(conn.Fd()), req, unix.UnixRights(rights...), nil, unix.MSG_NOSIGNAL)
	runtime.KeepAlive(in)
	unix.Close(fds[1])
	if err != nil {
		return nil, nil, fmt.Errorf("jail: helper: send: %w", err)
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(int(mine.Fd()), unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, nil, fmt.Errorf("jail: helper: %w", err)
	}
	buf := make([]byte, MaxHelperRequest+1)
	oob := make([]byte, unix.CmsgSpace(MaxHelperFiles*4))
	var n, oobn, flags int
	for {
		n, oobn, flags, _, err = unix.Recvmsg(int(mine.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.EAGAIN) {
		return nil, nil, fmt.Errorf("jail: helper: no reply within %v", timeout)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("jail: helper: %w", err)
	}
	got := rightsOf(oob[:oobn])
	files := make([]*os.File, len(got))
	for i, fd := range got {
		files[i] = os.NewFile(uintptr(fd), "helper-"+strconv.Itoa(i))
	}
	switch {
	case n == 0:
		err = errors.New("jail: helper: it ended without a reply")
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		err = errors.New("jail: helper: reply truncated")
	case buf[0] == 1:
		err = fmt.Errorf("jail: helper refused: %s", buf[1:n])
	case buf[0] != 0:
		err = fmt.Errorf("jail: helper: reply status %d", buf[0])
	}
	if err != nil {
		closeAll(files)
		return nil, nil, err
	}
	return append([]byte(nil), buf[1:n]...), files, nil
}
