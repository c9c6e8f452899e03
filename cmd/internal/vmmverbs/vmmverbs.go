// Package vmmverbs runs the verbs that are a VMM process (run, restore,
// fork-child, jail-init and jail-spawn) for the two binaries that have
// them: warren, with every other verb, and warren-vmm, with only these.
// warren-hostd starts its VMMs from warren-vmm when it finds one, so that
// no VMM process links, initialises and keeps the CLI's packages (its
// daemon client, MCP server, image and registry code): every VMM's private
// memory is smaller (bench/results/2026-12-05-vmm-binary). Their command
// lines are parsed and turned into specs by vmmproc (ParseRunArgs and
// RunArgs.Spec, ...), then run. fork-child and jail-spawn take no flags of
// a user's: they are handed over as they are.
package vmmverbs

import (
	"errors"
	"fmt"
	"io"

	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// Run runs verb with args as the VMM process; ok is false when verb is
// not one of the VMM's.
func Run(verb string, args []string, stdin io.Reader, stdout, stderr io.Writer) (code int, ok bool) {
	switch verb {
	case "run":
		return run(args, stdin, stdout, stderr), true
	case "restore":
		return restoreCmd(args, stdin, stdout, stderr), true
	case "fork-child":
		return vmmproc.ForkChild(args, stdout, stderr), true
	case jail.InitVerb:
		return jailInitCmd(args, stderr), true
	case jail.SpawnVerb:
		// a fork child on its way from jail-init's helper (vmmproc/jail.Spawner)
		return jail.RunSpawn(args, stderr), true
	}
	return 0, false
}

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
