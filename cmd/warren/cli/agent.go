package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/internal/atomicfile"
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
		req := agentwire.ExecRequest{Argv: argv, Env: e.env, Cwd: e.cwd, TimeoutMS: e.timeoutMS()}
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
		switch {
		case !errors.As(err, &ae):
		case ae.Code == agentwire.CodeNotFound:
			return exitNotFound
		case ae.Code == agentwire.CodeStartFailed || ae.Code == agentwire.CodePermission:
			return exitCannotRun
		}
		return exitExecFailed
	}
}

// execFlags are the flags of both exec verbs, the daemon's and the VM
// level's.
type execFlags struct {
	timeout     time.Duration
	cwd         string
	interactive bool
	env         stringsFlag
}

// newExecFlags defines the exec flags on fs; stdinHelp says what -i does.
func newExecFlags(fs *flag.FlagSet, stdinHelp string) *execFlags {
	e := &execFlags{}
	fs.DurationVar(&e.timeout, "timeout", 0, "kill the process (and its process group) after this long (0: never)")
	fs.StringVar(&e.cwd, "cwd", "", "working directory in the guest")
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
// and "-" on the host side is standard input or output.
func cpCmd(c *vmCmd) func() int {
	return func() int {
		src, err := agentclient.ParseTarget(c.fs.Arg(0))
		if err != nil {
			return c.fail(err)
		}
		dst, err := agentclient.ParseTarget(c.fs.Arg(1))
		if err != nil {
			return c.fail(err)
		}
		if src.InGuest() == dst.InGuest() {
			return c.fail(fmt.Errorf("exactly one of %s and %s must be VM:/guest/path", src, dst))
		}
		if dst.InGuest() {
			err = copyIn(c.context(), src.Path, dst, c.stdin)
		} else {
			err = copyOut(c.context(), src, dst.Path, c.stdout)
		}
		if err != nil {
			return c.fail(err)
		}
		return 0
	}
}

// openCopySource opens what `warren cp` copies into a guest: the host
// file hostPath with its permission bits, or stdin (mode 0644) for "-".
// A directory is refused. done closes the file.
func openCopySource(hostPath string, stdin io.Reader) (r io.Reader, mode fs.FileMode, done func(), err error) {
	if hostPath == "-" {
		return stdin, 0o644, func() {}, nil
	}
	f, err := os.Open(hostPath)
	if err != nil {
		return nil, 0, nil, err
	}
	fi, err := f.Stat()
	if err == nil && fi.IsDir() {
		err = fmt.Errorf("%s is a directory; warren cp copies files", hostPath)
	}
	if err != nil {
		f.Close()
		return nil, 0, nil, err
	}
	return f, fi.Mode(), func() { f.Close() }, nil
}

// copyIn copies a host file (or stdin for "-") to the guest, keeping its
// permission bits; into a guest directory it keeps the base name.
func copyIn(ctx context.Context, hostPath string, dst agentclient.Target, stdin io.Reader) error {
	c := agentclient.New(dst.VM)
	defer c.Close()
	r, mode, done, err := openCopySource(hostPath, stdin)
	if err != nil {
		return err
	}
	defer done()
	guestPath := dst.Path
	if fi, err := c.Stat(ctx, guestPath); err == nil && fi.IsDir && hostPath != "-" {
		guestPath = path.Join(guestPath, filepath.Base(hostPath))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_, err = c.WriteFile(ctx, guestPath, r, mode)
	return err
}

// copyOut copies a guest file to the host (or stdout for "-"), writing a
// temporary file that is renamed into place only when complete, with the
// guest file's permission bits; into a host directory it keeps the base
// name.
func copyOut(ctx context.Context, src agentclient.Target, hostPath string, stdout io.Writer) error {
	c := agentclient.New(src.VM)
	defer c.Close()
	return writeHostCopy(hostPath, src.Path, stdout, func(w io.Writer) (os.FileMode, error) {
		return c.ReadFile(ctx, src.Path, w)
	})
}

// writeHostCopy is the host side of copying a guest file out (warren cp,
// VM-level and daemon): read(w) writes the guest file guestPath into w
// and returns its mode. To "-" it goes to stdout; otherwise into a
// temporary file renamed into place only when complete, with the guest
// file's permission bits, and into a host directory under its base name.
func writeHostCopy(hostPath, guestPath string, stdout io.Writer, read func(io.Writer) (os.FileMode, error)) error {
	if hostPath == "-" {
		_, err := read(stdout)
		return err
	}
	if fi, err := os.Stat(hostPath); err == nil && fi.IsDir() {
		hostPath = filepath.Join(hostPath, path.Base(guestPath))
	}
	f, err := atomicfile.Create(hostPath, 0o600)
	if err != nil {
		return err
	}
	mode, err := read(f.File)
	if err == nil {
		err = f.Chmod(mode.Perm())
	}
	if err != nil {
		f.Abort()
		return err
	}
	return f.Commit()
}
