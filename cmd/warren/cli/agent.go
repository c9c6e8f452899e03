package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
)

// Exit codes of `warren exec` that do not come from the guest process,
// following timeout(1) and shells.
const (
	exitTimedOut    = 124 // the agent killed the process at --timeout
	exitExecFailed  = 125 // warren itself failed: no VM, no agent, bad flags
	exitCannotRun   = 126 // the program exists but could not be started
	exitNotFound    = 127 // no such program in the guest
	exitInterrupted = 130 // Ctrl-C: the process in the guest was killed
)

// stringsFlag is a repeatable string flag.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, " ") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

// interruptContext is cancelled by Ctrl-C or SIGTERM.
func interruptContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// execCmd is `warren exec [flags] VM -- PROGRAM [ARGS...]`: it runs the
// program in the guest, streams its output, and exits with its exit code.
func execCmd(c *vmCmd) func() int {
	e := newExecFlags(c.fs, "copy standard input to the process (otherwise it reads /dev/null)")
	return func() int {
		vmPath, argv, ok := e.command(c.fs.Args())
		if !ok {
			return c.usageErr()
		}
		for _, kv := range e.env {
			if !strings.Contains(kv, "=") || strings.HasPrefix(kv, "=") {
				return c.failCode(2, fmt.Errorf("--env %q is not KEY=VALUE", kv))
			}
		}
		if e.timeout < 0 {
			return c.failCode(2, fmt.Errorf("--timeout %v is negative", e.timeout))
		}
		ctx := c.context()
		vm := agentclient.New(vmPath)
		defer vm.Close()
		req := agentwire.ExecRequest{Argv: argv, Env: e.env, Cwd: e.cwd, User: e.user, TimeoutMS: e.timeoutMS()}
		if e.interactive && c.stdin != nil {
			req.Input = c.stdin
		}
		code, err := vm.Exec(ctx, req, c.stdout, c.stderr)
		switch {
		case err == nil:
			return code
		case ctx.Err() != nil:
			fmt.Fprintln(c.stderr, "warren exec: interrupted; the process in the guest was killed")
			return exitInterrupted
		case errors.Is(err, agentclient.ErrTimedOut):
			fmt.Fprintf(c.stderr, "warren exec: timed out after %v; the process was killed\n", e.timeout)
			return exitTimedOut
		}
		c.fail(err)
		var ae *agentwire.Error
		if errors.As(err, &ae) {
			return execFailure(ae.Code)
		}
		return exitExecFailed
	}
}

// execFailure is warren exec's exit code when the guest agent refused
// the process with the error code (agentwire.Code*).
func execFailure(code string) int {
	switch code {
	case agentwire.CodeNotFound:
		return exitNotFound
	case agentwire.CodeStartFailed, agentwire.CodePermission:
		return exitCannotRun
	}
	return exitExecFailed
}

// execFlags are the flags of both exec verbs, the daemon's and the VM
// level's.
type execFlags struct {
	timeout     time.Duration
	cwd         string
	user        string
	interactive bool
	env         stringsFlag
}

// newExecFlags defines the exec flags on fs; stdinHelp says what -i does.
func newExecFlags(fs *flag.FlagSet, stdinHelp string) *execFlags {
	e := &execFlags{}
	fs.DurationVar(&e.timeout, "timeout", 0, "kill the process (and its process group) after this long (0: never)")
	fs.StringVar(&e.cwd, "cwd", "", "working directory in the guest")
	fs.StringVar(&e.user, "user", "", "run the process as this guest user: a name or uid, or name:group (default the image's user, else root)")
	fs.BoolVar(&e.interactive, "i", false, stdinHelp)
	fs.Var(&e.env, "env", "set KEY=VALUE in the process's environment (repeatable)")
	return e
}

// command splits an exec's operands, TARGET -- PROGRAM [ARGS...]; ok is
// false for others.
func (e *execFlags) command(args []string) (target string, argv []string, ok bool) {
	if len(args) < 3 || args[1] != "--" {
		return "", nil, false
	}
	return args[0], args[2:], true
}

// timeoutMS is --timeout in milliseconds, at least 1 when set.
func (e *execFlags) timeoutMS() int64 {
	if e.timeout > 0 && e.timeout < time.Millisecond {
		return 1
	}
	return e.timeout.Milliseconds()
}

// healthCmd is `warren health VM`: the agent's health report as JSON.
func healthCmd(c *vmCmd) func() int {
	wait := c.fs.Duration("wait", 0, "keep trying this long until the agent answers")
	return func() int {
		vm := agentclient.New(c.fs.Arg(0))
		defer vm.Close()
		h, err := vm.WaitHealth(c.context(), time.Now().Add(*wait), 30*time.Second)
		return c.printJSON(h, err)
	}
}

// cpCmd is `warren cp SRC DST`, where exactly one side is VM:/guest/path
// and "-" on the host side is standard input or output (agentclient.Copy).
func cpCmd(c *vmCmd) func() int {
	return func() int {
		if err := agentclient.Copy(c.context(), c.fs.Arg(0), c.fs.Arg(1), c.stdin, c.stdout); err != nil {
			return c.fail(err)
		}
		return 0
	}
}
