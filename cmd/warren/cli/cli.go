// Package cli is the warren command's flag parsing, output and wiring:
// the verbs that run the VMM process (run, restore, fork-child, jail-init,
// jail-spawn: process.go) hand their parsed flags to vmmproc; the others
// talk to warren-hostd (daemon.go, images.go), to a running VMM's control
// API (control.go, through vmmctl) or to its guest agent (agent.go,
// through agentclient).
package cli

import (
	"fmt"
	"github.com/warrenvm/warren/vmmproc"
	"io"

	"github.com/warrenvm/warren/vmmproc/jail"
)

const usage = `VM-level commands (warren [vm] <command> [flags]):
  run      boot a microVM and stream its console until it powers off
  exec     run a command in a VM's guest: warren exec VM -- PROGRAM [ARGS...]
  cp       copy a file into or out of a VM: warren cp SRC DST (VM:/path on one side)
  health   show a VM's guest agent health: warren health VM
  pause    pause a running VM: warren pause API
  resume   resume a paused VM: warren resume API
  snapshot snapshot a running VM: warren snapshot [--incremental] [--every D --max-chain N] API DIR/NAME
  restore  run a VM from a snapshot: warren restore [--lazy] [--api PATH] [--vsock PATH] [--console FILE] DIR/NAME
  fork     make running copy-on-write children of a VM: warren fork [-n N] API
  flatten  write a fork's disk overlay and the images under it as one raw image: warren flatten OVERLAY OUT
  rollback put a running VM back to one of its snapshots in place: warren rollback API DIR/NAME
  compact  merge a snapshot's memory chain into a new full snapshot: warren compact DIR/NAME DIR/NEW

VM is the path of the VM's vsock unix socket (warren run --vsock PATH); API the
path of its control socket (warren run --api PATH).
`

// Main runs the warren command with args (without the program name) and
// returns the process exit code. stdin feeds the guest's serial console.
// The sandbox verbs talk to warren-hostd (daemon.go); the VM-level verbs
// of the same names run when their target is a VM's socket path.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, daemonUsage+usage)
		return 2
	}
	if code, ok := daemonMain(args, stdin, stdout, stderr); ok {
		return code
	}
	return vmMain(args, stdin, stdout, stderr)
}

// vmMain runs the VM-level verbs (`warren vm VERB ...`).
func vmMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch args[0] {
	case "run":
		return run(args[1:], stdin, stdout, stderr)
	case "exec":
		return execCmd(args[1:], stdin, stdout, stderr)
	case "cp":
		return cpCmd(args[1:], stdin, stdout, stderr)
	case "health":
		return healthCmd(args[1:], stdout, stderr)
	case "pause", "resume":
		return pauseCmd(args[0], args[1:], stdout, stderr)
	case "snapshot":
		return snapshotCmd(args[1:], stdout, stderr)
	case "restore":
		return restoreCmd(args[1:], stdin, stdout, stderr)
	case "fork":
		return forkCmd(args[1:], stdout, stderr)
	case "fork-child":
		return vmmproc.ForkChild(args[1:], stdout, stderr)
	case jail.InitVerb:
		// pid 1 of a jailed VMM's pid namespace (warren-hostd --jail)
		return jailInitCmd(args[1:], stderr)
	case jail.SpawnVerb:
		// a fork child on its way from jail-init's helper (vmmproc/jail.Spawner)
		return jail.RunSpawn(args[1:], stderr)
	case "flatten":
		return flattenCmd(args[1:], stdout, stderr)
	case "rollback":
		return rollbackCmd(args[1:], stdout, stderr)
	case "egress":
		return egressCmd(args[1:], stdout, stderr)
	case "compact":
		return compactCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "warren: unknown command %q\n%s", args[0], usage)
		return 2
	}
}
