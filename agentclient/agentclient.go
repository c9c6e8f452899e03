package agentclient

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/devices/virtio/vsock"
)

// New returns a client of the agent of the VM whose vsock unix socket is
// at udsPath. Each HTTP connection is one vsock stream to agentwire.Port.
// The guest is not trusted: every reply is read within DefaultLimits
// (size and time; see Client).
func New(udsPath string) *Client { return NewLimits(udsPath, Limits{}) }

// NewLimits is New with limits on what the client reads from the guest
// (zero fields: DefaultLimits').
func NewLimits(udsPath string, limits Limits) *Client {
	return NewDialLimits(func(ctx context.Context) (net.Conn, error) {
		return vsock.Dial(ctx, udsPath, agentwire.Port)
	}, limits)
}

// Target is one side of a copy: a host path, or a path inside the guest of
// the VM at VM (a vsock socket path).
type Target struct {
	// VM is the VM's vsock socket path; empty for a host path.
	VM string
	// Path is the file's path: absolute in the guest, any on the host
	// ("-" means standard input or output).
	Path string
}

// InGuest reports whether t names a guest file.
func (t Target) InGuest() bool { return t.VM != "" }

// String formats t as ParseTarget reads it.
func (t Target) String() string {
	if t.VM == "" {
		return t.Path
	}
	return t.VM + ":" + t.Path
}

// ParseTarget reads VM:/guest/path (split at the first colon followed by a
// slash, so guest paths are always absolute) or, without such a colon, a
// host path.
func ParseTarget(s string) (Target, error) {
	if s == "" {
		return Target{}, fmt.Errorf("empty path")
	}
	i := strings.Index(s, ":/")
	if i < 0 {
		return Target{Path: s}, nil
	}
	if i == 0 {
		return Target{}, fmt.Errorf("%q: empty VM socket path before ':'", s)
	}
	return Target{VM: s[:i], Path: s[i+1:]}, nil
}
