package vmmproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/vmmproc/jail"
	"golang.org/x/sys/unix"
)

// The family's helper (vmmproc/jail's helper, served by jail-init, which
// stays root): a VMM family asks it for what needs privilege after the
// VMM gave its own up. Two kinds of request, one JSON object each:
//
//	{"net": ...}    a private network (nethelper.go), with --net-helper
//	{"spawn": ...}  start a fork child under warren-hostd's grant
//	                (vmmproc/jail.Spawner), with --spawn
//
// A kind jail-init was not started for is refused.

// helperRequest is one request to the family's helper: exactly one field
// is set.
type helperRequest struct {
	Net   *netRequest   `json:"net,omitempty"`
	Spawn *spawnRequest `json:"spawn,omitempty"`
}

// spawnRequest asks for a fork child (`warren fork-child`) under Grant,
// signed by warren-hostd for that child. Its descriptors: the child's
// log (its standard output and error), then its descriptors 3, 4, ...
// (ForkChild's: the spec, the ready pipe, the memory files, the
// helper socket).
type spawnRequest struct {
	Grant string `json:"grant"`
}

// spawnReply is the helper's answer to a spawnRequest; its one
// descriptor, where the kernel has them, is a pidfd of the child.
type spawnReply struct {
	// PID is the child's, in the family's pid namespace.
	PID int `json:"pid"`
}

// newFamilyHelper returns jail-init's helper: private networks through
// devNet (a descriptor of /dev/net, openDevNet; -1: none served) and fork
// children through sp (nil: none served).
func newFamilyHelper(devNet int, sp *jail.Spawner) jail.HelperFunc {
	h := &familyHelper{devNet: devNet, spawner: sp, limit: newNetRateLimit()}
	return h.serve
}

// familyHelper is jail-init's helper for one family: what it serves with
// (a descriptor of /dev/net, -1: no networks; a Spawner, nil: no fork
// children) and its rate limit on networks. ServeHelper calls serve from
// one goroutine; limit has its own lock.
type familyHelper struct {
	devNet  int
	spawner *jail.Spawner
	limit   *netRateLimit
}

// serve serves one request b, with its descriptors in, from the family
// member pid.
func (h *familyHelper) serve(b []byte, in []*os.File, pid int) ([]byte, []*os.File, error) {
	devNet, sp := h.devNet, h.spawner
	var req helperRequest
	if err := strictjson.Unmarshal(b, &req); err != nil {
		return nil, nil, fmt.Errorf("bad request: %w", err)
	}
	switch {
	case req.Net != nil && req.Spawn == nil:
		if devNet < 0 {
			return nil, nil, errors.New("this family's helper makes no networks")
		}
		if len(in) != 0 {
			return nil, nil, errors.New("a network request carries no descriptors")
		}
		return serveNetRequest(devNet, h.limit, *req.Net)
	case req.Spawn != nil && req.Net == nil:
		if sp == nil {
			return nil, nil, errors.New("this family's helper starts no fork children")
		}
		child, pidfd, err := sp.Spawn(req.Spawn.Grant, []string{"fork-child"}, in, pid)
		if err != nil {
			return nil, nil, err
		}
		out, _ := json.Marshal(spawnReply{PID: child})
		var files []*os.File
		if pidfd != nil {
			files = []*os.File{pidfd}
		}
		return out, files, nil
	}
	return nil, nil, errors.New("bad request: want exactly one of net and spawn")
}

// spawnedChild is a fork child the family's helper started.
type spawnedChild struct {
	pid   int      // in the family's pid namespace
	pidfd *os.File // nil where the kernel has none
}

// kill kills the child (through its pidfd: the VMM's filter lets it
// signal nothing else).
func (c *spawnedChild) kill() {
	if c.pidfd != nil {
		unix.PidfdSendSignal(int(c.pidfd.Fd()), unix.SIGKILL, nil, 0)
	}
}

func (c *spawnedChild) close() {
	if c.pidfd != nil {
		c.pidfd.Close()
	}
}

// spawnViaHelper asks the helper on conn to start a fork child under
// grant, with log as its output and files as its descriptors 3, 4, ...
func spawnViaHelper(conn *os.File, grant string, log *os.File, files []*os.File) (*spawnedChild, error) {
	b, err := json.Marshal(helperRequest{Spawn: &spawnRequest{Grant: grant}})
	if err != nil {
		return nil, err
	}
	out, got, err := jail.CallHelper(conn, b, append([]*os.File{log}, files...), 30*time.Second)
	if err != nil {
		return nil, err
	}
	var rep spawnReply
	if err := json.Unmarshal(out, &rep); err != nil || rep.PID <= 0 || len(got) > 1 {
		for _, f := range got {
			f.Close()
		}
		return nil, fmt.Errorf("the helper's answer %q with %d descriptors (%v)", out, len(got), err)
	}
	c := &spawnedChild{pid: rep.PID}
	if len(got) == 1 {
		c.pidfd = got[0]
	}
	return c, nil
}
