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
// Not used, deliberately:
//   - a pid namespace: a VMM would be its pid 1, and its fork children,
//     which must outlive it and which the daemon supervises by the PIDs
//     the VMM reports, would die with it and have PIDs the daemon cannot
//     see;
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
		// warren SUBCOMMAND --jail PROFILE ARGS...
		args := append([]string{cmd.Args[0], cmd.Args[1], "--jail", profile}, cmd.Args[2:]...)
		cmd.Args = args
		attr := jail.SysProcAttr(jail.NSOptions{NoPidNS: true, NetNS: !spec.Network})
		attr.Pdeathsig = 0
		cmd.SysProcAttr = attr
		return nil
	}, nil
}
