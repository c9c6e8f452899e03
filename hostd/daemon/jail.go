package daemon

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/warrenvm/warren/hostd/jail"
)

// JailPrepare returns an ExecLauncher.Prepare that jails every VMM the
// daemon starts (hostd/jail): `--jail PROFILE` on its command line, so
// that the VMM hardens itself once its setup is done (seccomp allowlist,
// capabilities dropped, no_new_privs; its fork children inherit it), and
// new mount, ipc and uts namespaces, and a new, empty network namespace
// for a VMM without a network (its control socket and vsock are unix
// sockets by path, which work across network namespaces; its fork
// children share it). profile is "strict" or "vmm", optionally with
// ",log" (find missing syscalls) or ",kill".
//
// The daemon's VMMs serve the fork API (POST /v1/sandboxes/{id}/fork), so
// the default is "vmm": under "strict" a fork fails with EPERM.
//
// And a new pid namespace per VMM family: the VMM runs under `warren
// jail-init` (jail.RunInit), the namespace's pid 1, which mounts the
// namespace's /proc and reaps; the VMM's fork children live in the same
// namespace and outlive the VMM (the init stays while any does). The
// launcher returns the VMM's PID in the daemon's namespace (the init's
// child, which the init reports through SCM_CREDENTIALS: jail.ReceivePID),
// and the fork children's PIDs the VMM reports (its namespace's) are
// translated with jail.HostPID.
//
// Not used, deliberately:
//   - a network namespace for a network sandbox's VMM: it makes its own
//     (`warren run --private-net`: its tap and egress services live
//     there) and keeps the host's for its upstream connections;
//   - Pdeathsig: a VMM outlives the daemon, which re-adopts it when it
//     starts again.
func JailPrepare(profile string) (func(cmd *exec.Cmd, spec LaunchSpec) error, error) {
	switch p, _, _ := strings.Cut(profile, ","); p {
	case "strict", "vmm":
	default:
		return nil, fmt.Errorf("jail %q: want strict, vmm or off", profile)
	}
	return func(cmd *exec.Cmd, spec LaunchSpec) error {
		if len(cmd.Args) < 2 {
			return fmt.Errorf("jail: no subcommand in %q", cmd.Args)
		}
		// warren jail-init --report-fd 3 -- warren SUBCOMMAND --jail PROFILE ARGS...
		// (ExecLauncher passes the report socket as fd 3.)
		args := []string{cmd.Args[0], jail.InitVerb, "--report-fd", "3", "--", cmd.Path, cmd.Args[1], "--jail", profile}
		cmd.Args = append(args, cmd.Args[2:]...)
		attr := jail.SysProcAttr(jail.NSOptions{NetNS: !spec.Network})
		attr.Pdeathsig = 0
		cmd.SysProcAttr = attr
		return nil
	}, nil
}
