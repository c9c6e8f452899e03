package cli

// The verbs that run the VMM process (run, restore, jail-init): their
// command lines parsed and turned into specs by vmmproc (ParseRunArgs
// and RunArgs.Spec, ...), then run. fork-child and jail-spawn take no
// flags of a user's (cli.go hands them over as they are).

import (
	"errors"
	"fmt"
	"io"

	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc"
)

// restoreCmd is `warren restore [--lazy] [--api PATH] [--vsock PATH] [--console FILE] DIR/NAME`:
// it rebuilds the VM of a snapshot, with the devices of the `warren run`
// that took it, and runs it in the foreground like `warren run`. Its
// flags are vmmproc.ParseRestoreArgs's (vmmctl.Launch's decoder).
func restoreCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a, err := vmmproc.ParseRestoreArgs(args, stderr)
	if err != nil {
		return 2
	}
	s, err := a.Spec(stdout, stderr)
	if err == nil {
		err = vmmproc.Restore(s, stdin)
	}
	var usage *vmmproc.UsageError
	if errors.As(err, &usage) {
		fmt.Fprintf(stderr, "warren restore: %v\n", err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren restore: %v\n", err)
		return 1
	}
	return 0
}

// run is `warren run`: its flags are vmmproc.ParseRunArgs's
// (vmmctl.Launch's decoder).
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a, err := vmmproc.ParseRunArgs(args, stderr)
	if err != nil {
		return 2
	}
	s, closeOut, err := a.Spec(stdout, stderr)
	if err == nil {
		defer closeOut()
		err = vmmproc.Run(s, stdin)
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren run: %v\n", err)
		return 1
	}
	return 0
}

// jailInitCmd is `warren jail-init [--report-fd N] [--pass-fds N]
// [--cgroup DIR]... [--net-helper] [--spawn [--cgroup-root DIR]...] --
// COMMAND...`: vmmproc/jail.RunInit with the family's helper
// (familyhelper.go).
func jailInitCmd(args []string, stderr io.Writer) int {
	a, err := vmmproc.ParseJailInitArgs(args, stderr)
	if err != nil {
		return 2
	}
	if err := cgroup.JoinSelf(a.Cgroups); err != nil {
		fmt.Fprintf(stderr, "warren %s: %v\n", vmmctl.JailInitVerb, err)
		return 1
	}
	code, err := vmmproc.JailInit(a.InitSpec)
	if err != nil {
		fmt.Fprintf(stderr, "warren %s: %v\n", vmmctl.JailInitVerb, err)
	}
	return code
}
