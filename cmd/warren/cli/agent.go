package cli

import (
	"context"
	"encoding/json"
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
func execCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: warren exec [flags] VM -- PROGRAM [ARGS...]\n\nVM is the path of the VM's vsock socket (warren run --vsock).\n\n")
		fs.PrintDefaults()
	}
	timeout := fs.Duration("timeout", 0, "kill the process (and its process group) after this long (0: never)")
	cwd := fs.String("cwd", "", "working directory in the guest")
	interactive := fs.Bool("i", false, "copy standard input to the process (otherwise it reads /dev/null)")
	var env stringsFlag
	fs.Var(&env, "env", "set KEY=VALUE in the process's environment (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rest := fs.Args()
	if len(rest) < 2 || rest[1] != "--" || len(rest) < 3 {
		fs.Usage()
		return 2
	}
	vm, argv := rest[0], rest[2:]
	for _, e := range env {
		if !strings.Contains(e, "=") || strings.HasPrefix(e, "=") {
			fmt.Fprintf(stderr, "warren exec: --env %q is not KEY=VALUE\n", e)
			return 2
		}
	}
	if *timeout < 0 {
		fmt.Fprintf(stderr, "warren exec: --timeout %v is negative\n", *timeout)
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	c := agentclient.New(vm)
	defer c.Close()
	req := agentwire.ExecRequest{Argv: argv, Env: env, Cwd: *cwd, TimeoutMS: timeout.Milliseconds()}
	if *timeout > 0 && req.TimeoutMS == 0 {
		req.TimeoutMS = 1
	}
	if *interactive && stdin != nil {
		req.Input = stdin
	}
	code, err := c.Exec(ctx, req, stdout, stderr)
	switch {
	case err == nil:
		return code
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "warren exec: interrupted; the process in the guest was killed")
		return exitInterrupted
	case errors.Is(err, agentclient.ErrTimedOut):
		fmt.Fprintf(stderr, "warren exec: timed out after %v; the process was killed\n", *timeout)
		return exitTimedOut
	}
	fmt.Fprintf(stderr, "warren exec: %v\n", err)
	var ae *agentwire.Error
	if errors.As(err, &ae) && (ae.Code == agentwire.CodeStartFailed || ae.Code == agentwire.CodeNotFound ||
		ae.Code == agentwire.CodePermission) {
		if ae.Code == agentwire.CodeNotFound {
			return exitNotFound
		}
		return exitCannotRun
	}
	return exitExecFailed
}

// healthCmd is `warren health VM`: the agent's health report as JSON.
func healthCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wait := fs.Duration("wait", 0, "keep trying this long until the agent answers")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: warren health [--wait D] VM")
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	c := agentclient.New(fs.Arg(0))
	defer c.Close()
	h, err := c.WaitHealth(ctx, time.Now().Add(*wait), 30*time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "warren health: %v\n", err)
		return 1
	}
	b, _ := json.MarshalIndent(h, "", "  ")
	fmt.Fprintf(stdout, "%s\n", b)
	return 0
}

// cpCmd is `warren cp SRC DST`, where exactly one side is VM:/guest/path
// and "-" on the host side is standard input or output.
func cpCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren cp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: warren cp SRC DST\n\nOne of SRC and DST is VM:/guest/path (VM: the vsock socket path); the other a host path or - (stdin/stdout).\n")
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "warren cp: %v\n", err)
		return 1
	}
	src, err := agentclient.ParseTarget(fs.Arg(0))
	if err != nil {
		return fail(err)
	}
	dst, err := agentclient.ParseTarget(fs.Arg(1))
	if err != nil {
		return fail(err)
	}
	if src.InGuest() == dst.InGuest() {
		return fail(fmt.Errorf("exactly one of %s and %s must be VM:/guest/path", src, dst))
	}
	ctx, stop := interruptContext()
	defer stop()
	if dst.InGuest() {
		err = copyIn(ctx, src.Path, dst, stdin)
	} else {
		err = copyOut(ctx, src, dst.Path, stdout)
	}
	if err != nil {
		return fail(err)
	}
	return 0
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
