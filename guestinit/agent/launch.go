//go:build linux

package agent

import (
	"net/http"
	"strings"
	"syscall"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/guestinit/etc"
)

// launch is how one process is started, resolved from a request's (or a
// service's) argv, env, cwd and user against the server's defaults.
type launch struct {
	prog string   // the executable's path
	argv []string // argv, argv[0] replaced by prog when found in PATH
	env  []string
	dir  string              // "" means the agent's own
	cred *syscall.Credential // nil means the agent's own
}

// resolve makes the launch of argv with the request's env, cwd and user:
//
//   - the user is user, else the server's default; when there is one it
//     is resolved against the server's passwd and group (etc.LookupUser)
//     and the process runs with its uid, gid and supplementary groups;
//   - the environment is the server's base environment, then HOME from
//     that user's passwd entry when the base has no HOME, then the extra
//     environment (SetExtraEnv), then env, later entries replacing
//     earlier ones of the same name;
//   - the working directory is cwd, else the server's default;
//   - argv[0] without a slash is looked up in the resulting PATH.
//
// It reads the passwd and group files at every call, so a user added
// after boot (useradd at template build) can be named at once.
func (s *Server) resolve(argv, env []string, cwd, user string) (launch, error) {
	if len(argv) == 0 || argv[0] == "" {
		return launch{}, badRequest("empty argv")
	}
	l := launch{dir: cwd}
	if l.dir == "" {
		l.dir = s.dir
	}
	if user == "" {
		user = s.user
	}
	base := s.env
	if user != "" {
		c, err := etc.LookupUser(s.etcDir, user)
		if err != nil {
			return launch{}, &agentwire.Error{Message: "user: " + err.Error(), Code: agentwire.CodeBadRequest, Status: http.StatusBadRequest}
		}
		l.cred = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: c.Groups}
		if !hasEnv(base, "HOME") {
			base = mergeEnv(base, []string{"HOME=" + c.Home})
		}
	}
	s.mu.Lock()
	extra := s.extraEnv
	s.mu.Unlock()
	l.env = mergeEnv(mergeEnv(base, extra), env)
	prog, err := lookPath(argv[0], l.env)
	if err != nil {
		return launch{}, err
	}
	l.prog, l.argv = prog, execArgv(argv, prog)
	return l, nil
}

// hasEnv reports whether env sets name.
func hasEnv(env []string, name string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}
