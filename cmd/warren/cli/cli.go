// Package cli is the warren command's flag parsing, output and wiring:
// the verbs that run the VMM process (run, restore, fork-child, jail-init,
// jail-spawn) are cmd/internal/vmmverbs's, shared with warren-vmm; the others
// talk to warren-hostd (daemon.go, sandboxes.go, images.go, through
// hostd/client), to a running VMM's control API (control.go, through
// vmmctl) or to its guest agent (agent.go, through agentclient). The
// verbs of each kind are rows of a table (daemonVerbs, vmVerbs), run by
// one driver (daemonCmd, vmCmd) that parses their flags, checks their
// operands and reports their errors.
package cli

import (
	"fmt"
	"io"

	"github.com/warrenvm/warren/cmd/internal/vmmverbs"
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
  describe a snapshot's vCPUs, irqchip and virtqueues (why a guest is silent): warren describe DIR/NAME

VM is the path of the VM's vsock unix socket (warren run --vsock PATH); API the
path of its control socket (warren run --api PATH).
`

// Main runs the warren command with args (without the program name) and
// returns the process exit code. stdin feeds the guest's serial console.
// The sandbox verbs talk to warren-hostd (daemon.go); the VM-level verbs
// of the same names run when their target is a VM's socket path.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return (&app{stdin: stdin, stdout: stdout, stderr: stderr}).main(args)
}

// app is one run of the warren command: the streams every verb reads and
// writes, and (for tests) whether it only routes.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// routeOnly makes daemonMain only decide between the daemon and the
	// VM level, running nothing.
	routeOnly bool
}

func (a *app) main(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(a.stderr, daemonUsage+usage)
		return 2
	}
	if code, ok := a.daemonMain(args); ok {
		return code
	}
	return a.vmMain(args)
}

// vmMain runs the VM-level verbs (`warren vm VERB ...`).
func (a *app) vmMain(args []string) int {
	verb, rest := args[0], args[1:]
	if v, ok := vmVerbs[verb]; ok {
		return a.runVM(verb, v, rest)
	}
	if code, ok := vmmverbs.Run(verb, rest, a.stdin, a.stdout, a.stderr); ok {
		return code
	}
	switch verb {
	case "help", "-h", "--help":
		fmt.Fprint(a.stdout, usage)
		return 0
	}
	fmt.Fprintf(a.stderr, "warren: unknown command %q\n%s", verb, usage)
	return 2
}
