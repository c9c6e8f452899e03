package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/hostd/store"
)

// PeerCred is the kernel's account of the process at the other end of a
// unix-socket connection (SO_PEERCRED), taken when it connected.
type PeerCred struct {
	PID, UID, GID int
}

type peerCredKey struct{}

// peerConnContext records the peer's credentials of a unix-socket
// connection in its requests' context (http.Server.ConnContext). A
// connection of another kind gets none.
func peerConnContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || gerr != nil {
		return ctx
	}
	return context.WithValue(ctx, peerCredKey{}, PeerCred{PID: int(cred.Pid), UID: int(cred.Uid), GID: int(cred.Gid)})
}

// PeerCredOf returns the peer credentials of r's unix-socket connection.
func PeerCredOf(r *http.Request) (PeerCred, bool) {
	c, ok := r.Context().Value(peerCredKey{}).(PeerCred)
	return c, ok
}

// TenantUIDs maps a local uid to the tenants its processes may act for on
// the unix socket; the tenant "*" is every tenant.
type TenantUIDs map[int][]string

// AnyTenant, as a uid's tenant in TenantUIDs, lets it act for any tenant.
const AnyTenant = "*"

// ParseTenantUID adds one `UID=tenant[,tenant...]` (the tenant "*": any)
// to m.
func (m TenantUIDs) ParseTenantUID(s string) error {
	u, list, ok := strings.Cut(s, "=")
	uid, err := strconv.Atoi(u)
	if !ok || err != nil || uid < 0 || list == "" {
		return fmt.Errorf("%q: want UID=tenant[,tenant...]", s)
	}
	for _, t := range strings.Split(list, ",") {
		if t != AnyTenant && !store.ValidTenant(t) {
			return fmt.Errorf("%q: bad tenant %q: want [a-z0-9-]{1,63} or *", s, t)
		}
		if !slices.Contains(m[uid], t) {
			m[uid] = append(m[uid], t)
		}
	}
	return nil
}

// PeerAuth authenticates requests on the unix socket by the uid of the
// connecting process (SO_PEERCRED), which the client cannot forge:
//
//   - uid 0 and the daemon's own uid (the operator) act for any tenant,
//     named by TenantHeader;
//   - a uid in uids acts for its tenants: TenantHeader names one of them
//     (it may be left out when the uid has exactly one), or any tenant
//     with "*";
//   - any other uid, or a mapped uid naming a tenant not its own, is
//     answered 403.
//
// So a local user who can open the socket acts only as the operator
// allows; the socket file's mode is a second fence, not the only one.
func PeerAuth(uids TenantUIDs) Authenticator {
	self := os.Geteuid()
	return func(r *http.Request) (string, error) {
		cred, ok := PeerCredOf(r)
		if !ok {
			return "", errf(401, "no peer credentials on this connection")
		}
		h := r.Header.Get(TenantHeader)
		allowed := uids[cred.UID]
		if cred.UID == 0 || cred.UID == self || slices.Contains(allowed, AnyTenant) {
			return HeaderAuth(r)
		}
		if len(allowed) == 0 {
			return "", errf(403, "uid %d may not use this daemon (warren-hostd --tenant-uid)", cred.UID)
		}
		if h == "" {
			if len(allowed) == 1 {
				return allowed[0], nil
			}
			return "", errf(401, "missing %s header (uid %d acts for %s)", TenantHeader, cred.UID, strings.Join(allowed, ", "))
		}
		if !store.ValidTenant(h) {
			return "", errf(400, "bad tenant %q: want [a-z0-9-]{1,63}", h)
		}
		if !slices.Contains(allowed, h) {
			return "", errf(403, "uid %d may not act for tenant %q", cred.UID, h)
		}
		return h, nil
	}
}
