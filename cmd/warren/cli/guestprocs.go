package cli

// The daemon verbs of the process API (rows of daemonVerbs): ps, logs,
// attach, signal and wait, and the process API's side of exec (-d, -t,
// --user: startSession). The session itself is session.go's.

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// processFlags are the flags the daemon's exec adds for the process API.
type processFlags struct {
	detach, tty bool
}

// newProcessFlags defines exec's process API flags on d.fs.
func newProcessFlags(d *daemonCmd) *processFlags {
	p := &processFlags{}
	d.fs.BoolVar(&p.detach, "d", false, "start the process in the background and print its id (see warren ps, logs, attach, wait)")
	d.fs.BoolVar(&p.tty, "t", false, "run the process on a terminal: an interactive session (the local terminal raw, its size followed; Ctrl-] detaches)")
	return p
}

// wanted says exec goes through the process API rather than /exec: for
// -d or -t, or for a --user (e), which /exec does not take.
func (p *processFlags) wanted(e *execFlags) bool { return p.detach || p.tty || e.user != "" }

// startSession is exec through the process API: it starts req in sandbox
// id and, with -d, prints its id (after sending standard input with -i);
// otherwise it runs a session with it until it exits (the exit code is
// the process's) and an interrupt kills it.
func (d *daemonCmd) startSession(id string, req wire.ProcessRequest, p *processFlags, interactive bool) int {
	if p.tty {
		size := d.terminalSize()
		req.PTY = &size
	}
	req.Stdin = interactive && req.PTY == nil
	pi, err := d.c.StartProcess(d.ctx, id, req)
	if err != nil {
		d.fail(err)
		var e *client.Error
		if errors.As(err, &e) {
			return execFailure(e.Code)
		}
		return exitExecFailed
	}
	if p.detach {
		if interactive && d.stdin != nil {
			if err := d.c.SendStdin(d.ctx, id, pi.ID, d.stdin, true); err != nil {
				return d.fail(err)
			}
		}
		if *d.asJSON {
			printJSON(d.stdout, pi)
		} else {
			fmt.Fprintln(d.stdout, pi.ID)
		}
		return 0
	}
	s := &session{d: d, id: id, pid: pi.ID, pty: p.tty, forward: interactive || p.tty, kill: true}
	return s.run(-1)
}

// psCmd is `warren ps SANDBOX`: the sandbox's processes.
func psCmd(d *daemonCmd) func() int {
	return func() int {
		l, err := d.c.Processes(d.ctx, d.id)
		return show(d, l, err, func(l []wire.ProcessInfo) {
			tw := tabwriter.NewWriter(d.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPID\tSTATE\tEXIT\tSTARTED\tCOMMAND")
			for _, p := range l {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", p.ID, p.Pid, p.State, exitText(p.Exit), ago(p.StartedAt), commandText(p.Argv))
			}
			tw.Flush()
		})
	}
}

// exitText is a process's exit in a table: its code, with the signal
// that killed it or the timeout.
func exitText(st *agentwire.ExitStatus) string {
	switch {
	case st == nil:
		return "-"
	case st.TimedOut:
		return fmt.Sprintf("%d (timed out)", st.Code)
	case st.Signal != "":
		return fmt.Sprintf("%d (%s)", st.Code, st.Signal)
	}
	return fmt.Sprint(st.Code)
}

// commandText is argv in a table: quoted where needed, at most 60
// characters.
func commandText(argv []string) string {
	var parts []string
	for _, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$") {
			a = fmt.Sprintf("%q", a)
		}
		parts = append(parts, a)
	}
	s := strings.Join(parts, " ")
	if r := []rune(s); len(r) > 60 {
		s = string(r[:59]) + "…"
	}
	return s
}

// logsCmd is `warren logs [-f] [--offset N] SANDBOX PID`: the process's
// output kept in the guest, from offset N (default: the oldest kept), and
// with -f what comes next, until it exits.
func logsCmd(d *daemonCmd) func() int {
	follow := d.fs.Bool("f", false, "follow the output until the process exits")
	offset := d.fs.Int64("offset", -1, "start at this offset of the process's output (bytes since its start; default the oldest kept)")
	return func() int {
		pid := d.fs.Arg(1)
		if *follow {
			s := &session{d: d, id: d.id, pid: pid}
			if _, err := s.follow(d.ctx, *offset); err != nil && d.ctx.Err() == nil {
				return d.fail(err)
			}
			return 0
		}
		err := d.c.ProcessOutput(d.ctx, d.id, pid, *offset, false, func(f wire.ExecFrame) error {
			if f.Start != nil && f.Start.Dropped > 0 {
				fmt.Fprintf(d.stderr, "%s: %d bytes of output before offset %d are no longer kept\n", d.name, f.Start.Dropped, f.Start.Offset)
			}
			if _, err := d.stdout.Write(f.Stdout); err != nil {
				return err
			}
			_, err := d.stderr.Write(f.Stderr)
			return err
		})
		if err != nil {
			return d.fail(err)
		}
		return 0
	}
}

// attachCmd is `warren attach [--from-start] SANDBOX PID`: a session with
// a running process, its output from now on (or replayed from the
// oldest byte kept), standard input forwarded when the process takes it
// (raw, with the terminal's size, when it is on one). An interrupt or
// Ctrl-] detaches; the exit code is the process's.
func attachCmd(d *daemonCmd) func() int {
	fromStart := d.fs.Bool("from-start", false, "replay the output kept from the oldest byte first")
	noStdin := d.fs.Bool("no-stdin", false, "do not forward standard input")
	return func() int {
		pi, err := d.c.Process(d.ctx, d.id, d.fs.Arg(1))
		if err != nil {
			return d.fail(err)
		}
		offset := pi.OutputBytes
		if *fromStart {
			offset = -1
		}
		s := &session{d: d, id: d.id, pid: pi.ID, pty: pi.PTY != nil, forward: pi.StdinOpen && !*noStdin}
		return s.run(offset)
	}
}

// signalCmd is `warren signal SANDBOX PID SIGNAL`.
func signalCmd(d *daemonCmd) func() int {
	return func() int {
		pi, err := d.c.SignalProcess(d.ctx, d.id, d.fs.Arg(1), d.fs.Arg(2))
		return show(d, pi, err, func(pi *wire.ProcessInfo) { fmt.Fprintf(d.stdout, "%s %s\n", pi.ID, pi.State) })
	}
}

// waitCmd is `warren wait SANDBOX PID`: it waits until the process has
// exited and exits with its code (124 when its timeout killed it).
func waitCmd(d *daemonCmd) func() int {
	return func() int {
		var pi *wire.ProcessInfo
		var err error
		for tries := 0; tries < maxReconnects; tries++ {
			pi, err = d.c.WaitProcess(d.ctx, d.id, d.fs.Arg(1))
			var ce *client.Error
			// The daemon's 409 "reconnect": the sandbox was rolled back
			// under the wait; the process may still run.
			if !errors.As(err, &ce) || ce.Status != http.StatusConflict || !strings.Contains(ce.Message, "reconnect") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil && d.ctx.Err() != nil {
			return exitInterrupted // the process runs on
		}
		if code := show(d, pi, err, func(*wire.ProcessInfo) {}); code != 0 {
			return code
		}
		if pi.Exit == nil {
			return d.fail(fmt.Errorf("process %s: the daemon answered without its exit", pi.ID))
		}
		if pi.Exit.TimedOut {
			return exitTimedOut
		}
		return pi.Exit.Code
	}
}
