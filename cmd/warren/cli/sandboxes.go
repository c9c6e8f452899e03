package cli

// The daemon verbs on sandboxes (rows of daemonVerbs): create, ls, rm,
// events, exec, cp, pause, resume, snapshot, fork, rollback, egress and
// balloon (exec's process API side, -d, -t and --user, is guestprocs.go's).

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/vmmctl"
)

func createCmd(d *daemonCmd) func() int {
	tpl := d.fs.String("template", "", "the template (default: the tenant's only ready template)")
	mem := d.fs.Int("mem", 0, "the VMM's memory limit in MiB (default: the template's guest memory)")
	cpus := d.fs.Int("cpus", 0, "the VMM's CPU limit (default: the template's vCPUs)")
	name := d.fs.String("name", "", "a name for the sandbox (its \"name\" label), usable instead of its id")
	egress := d.fs.String("egress", "", "the sandbox's egress policy (JSON; needs a --network template)")
	var env, labels, secrets stringsFlag
	d.fs.Var(&env, "env", "KEY=VALUE set in every exec (repeatable)")
	d.fs.Var(&labels, "label", "KEY=VALUE label (repeatable)")
	d.fs.Var(&secrets, "secret", "a secret of the tenant (warren secrets set) the egress policy's credentials may use (repeatable)")
	return func() int {
		req := wire.SandboxRequest{Template: *tpl, MemMiB: *mem, CPUs: *cpus, Env: env, Secrets: secrets}
		var err error
		if *egress != "" {
			if req.Egress, err = client.ReadPolicy(*egress); err != nil {
				return d.fail(err)
			}
		}
		if *name != "" {
			labels = append(labels, "name="+*name)
		}
		if req.Labels, err = client.ParseLabels(labels); err != nil {
			fmt.Fprintf(d.stderr, "warren create: --label %v\n", err)
			return 2
		}
		if req.Template == "" {
			ready, err := d.c.ReadyTemplates(d.ctx)
			if err != nil {
				return d.fail(err)
			}
			if len(ready) != 1 {
				return d.fail(fmt.Errorf("--template is needed: the tenant has %d ready templates", len(ready)))
			}
			req.Template = ready[0]
		}
		s, err := d.c.Create(d.ctx, req, d.progress("create"))
		return show(d, s, err, func(s *client.Sandbox) { fmt.Fprintln(d.stdout, s.ID) })
	}
}

var lsCmd = listing((*client.Client).Sandboxes, "ID\tNAME\tSTATUS\tTEMPLATE\tPARENT\tPID\tMEM\tSNAPSHOTS\tCREATED", func(s client.Sandbox) string {
	status := s.Status
	if s.Reason != "" {
		status += " (" + s.Reason + ")"
	}
	pid := "-"
	if s.PID > 0 {
		pid = fmt.Sprint(s.PID)
	}
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s", s.ID, orDash(s.Labels["name"]), status, s.Template, orDash(s.Parent), pid, s.MemMiB, len(s.Snapshots), ago(s.Created))
})

// rmCmd deletes the sandboxes named, printing each one's id.
var rmCmd = each(func(c *client.Client, ctx context.Context, ref string) (string, error) {
	id, err := c.Resolve(ctx, ref)
	if err == nil {
		err = c.Delete(ctx, id)
	}
	return id, err
})

func eventsCmd(d *daemonCmd) func() int {
	return func() int {
		enc := json.NewEncoder(d.stdout)
		err := d.c.Events(d.ctx, func(e wire.Event) bool {
			if *d.asJSON {
				return enc.Encode(e) == nil
			}
			subject := e.Sandbox
			if subject == "" {
				subject = e.Template
			}
			_, err := fmt.Fprintf(d.stdout, "%s %-16s %s %s\n", e.Time.Local().Format("15:04:05.000"), e.Type, subject, e.Detail)
			return err == nil
		})
		if err != nil && d.ctx.Err() == nil {
			return d.fail(err)
		}
		return 0
	}
}

func sbExecCmd(d *daemonCmd) func() int {
	e := newExecFlags(d.fs, "send standard input to the process (without -t or -d: read to its end first)")
	pf := newProcessFlags(d)
	return func() int {
		ref, argv, ok := e.command(d.fs.Args())
		if !ok || e.timeout < 0 {
			return d.usageErr()
		}
		if pf.wanted(e) {
			id, err := d.c.Resolve(d.ctx, ref)
			if err != nil {
				d.fail(err)
				return exitExecFailed
			}
			return d.startSession(id, wire.ProcessRequest{Argv: argv, Env: e.env, Cwd: e.cwd, User: e.user, TimeoutMS: e.timeoutMS()}, pf, e.interactive)
		}
		req := wire.ExecRequest{Argv: argv, Env: e.env, Cwd: e.cwd, TimeoutMS: e.timeoutMS()}
		if e.interactive && d.stdin != nil {
			b, err := io.ReadAll(d.stdin)
			if err != nil {
				d.fail(err)
				return exitExecFailed
			}
			if b == nil {
				b = []byte{}
			}
			req.Stdin = b
		}
		id, err := d.c.Resolve(d.ctx, ref)
		if err != nil {
			d.fail(err)
			return exitExecFailed
		}
		st, err := d.c.Exec(d.ctx, id, req, d.stdout, d.stderr)
		switch {
		case err == nil:
		case d.ctx.Err() != nil:
			fmt.Fprintln(d.stderr, "warren exec: interrupted; the process in the guest was killed")
			return exitInterrupted
		default:
			d.fail(err)
			var e *client.Error
			if errors.As(err, &e) {
				return execFailure(e.Code)
			}
			return exitExecFailed
		}
		if st.TimedOut {
			fmt.Fprintf(d.stderr, "warren exec: timed out after %v; the process was killed\n", e.timeout)
			return exitTimedOut
		}
		return st.Exit
	}
}

// sbCpCmd is `warren cp SRC DST` through the daemon (client.Copy).
func sbCpCmd(d *daemonCmd) func() int {
	return func() int {
		if err := d.c.Copy(d.ctx, d.fs.Arg(0), d.fs.Arg(1), d.stdin, d.stdout); err != nil {
			return d.fail(err)
		}
		return 0
	}
}

// sandboxLine prints a sandbox's id and status.
func (d *daemonCmd) sandboxLine(s *client.Sandbox) { fmt.Fprintf(d.stdout, "%s %s\n", s.ID, s.Status) }

func sbPauseCmd(d *daemonCmd) func() int {
	toDisk := d.fs.Bool("to-disk", false, "snapshot the sandbox and stop its VMM (status suspended; resume restores it)")
	return func() int {
		s, err := d.c.Pause(d.ctx, d.id, *toDisk, d.progress("pause"))
		return show(d, s, err, d.sandboxLine)
	}
}

func sbResumeCmd(d *daemonCmd) func() int {
	return func() int {
		s, err := d.c.Resume(d.ctx, d.id, d.progress("resume"))
		return show(d, s, err, d.sandboxLine)
	}
}

const sbSnapshotUsage = "snapshot [--incremental] [--name NAME] SANDBOX\n" +
	"       warren snapshot --every D [--keep N] SANDBOX   (rolling; --every 0 stops them)\n" +
	"       warren snapshot --list SANDBOX"

func sbSnapshotCmd(d *daemonCmd) func() int {
	incremental := d.fs.Bool("incremental", false, "store only the pages written since the sandbox's previous snapshot")
	name := d.fs.String("name", "", "the snapshot's name (default snap-N)")
	every := d.fs.String("every", "", "take rolling snapshots at this interval, kept by the daemon (0: stop them)")
	keep := d.fs.Int("keep", 0, "with --every: layers in a chain before a new full snapshot (daemon default 8)")
	list := d.fs.Bool("list", false, "list the sandbox's snapshots")
	return func() int {
		switch {
		case *list:
			snaps, rolling, err := d.c.Snapshots(d.ctx, d.id)
			return show(d, map[string]any{"snapshots": snaps, "rolling": rolling}, err, func(map[string]any) {
				tw := tabwriter.NewWriter(d.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tKIND\tBYTES\tROLLING\tTIME")
				for _, s := range snaps {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%s\n", s.Name, s.Kind, s.Bytes, s.Rolling, s.Time.Local().Format(time.DateTime))
				}
				tw.Flush()
				if rolling != nil {
					fmt.Fprintf(d.stdout, "rolling: every %s, keep %d\n", rolling.Every, rolling.Keep)
				}
			})
		case *every != "":
			var dur time.Duration
			if *every != "0" && *every != "off" {
				var err error
				if dur, err = time.ParseDuration(*every); err != nil || dur <= 0 {
					fmt.Fprintf(d.stderr, "warren snapshot: --every %q is not a duration\n", *every)
					return 2
				}
			}
			r, err := d.c.SetRolling(d.ctx, d.id, dur, *keep)
			return show(d, map[string]any{"rolling": r}, err, func(map[string]any) {
				if r == nil {
					fmt.Fprintf(d.stdout, "%s: rolling snapshots off\n", d.id)
				} else {
					fmt.Fprintf(d.stdout, "%s: rolling snapshots every %s, keep %d\n", d.id, r.Every, r.Keep)
				}
			})
		}
		s, err := d.c.Snapshot(d.ctx, d.id, wire.SnapshotRequest{Name: *name, Incremental: *incremental})
		return show(d, s, err, func(s *client.Snapshot) { fmt.Fprintln(d.stdout, s.Name) })
	}
}

func sbForkCmd(d *daemonCmd) func() int {
	n := d.fs.Int("n", 1, "number of children (1-64)")
	return func() int {
		if *n < 1 {
			return d.usageErr()
		}
		r, err := d.c.Fork(d.ctx, d.id, *n, d.progress("fork"))
		code := show(d, r, err, func(r *wire.ForkResult) {
			for _, c := range r.Children {
				fmt.Fprintln(d.stdout, c.ID)
			}
			fmt.Fprintf(d.stderr, "warren fork: %d of %d children; parent paused %.1f ms\n", len(r.Children), *n, r.PauseMS)
		})
		if code != 0 {
			return code
		}
		for _, e := range r.Errors {
			fmt.Fprintf(d.stderr, "warren fork: %s\n", e)
		}
		if len(r.Children) < *n {
			return 1
		}
		return 0
	}
}

func sbRollbackCmd(d *daemonCmd) func() int {
	return func() int {
		rep, err := d.c.Rollback(d.ctx, d.id, d.fs.Arg(1))
		return show(d, rep, err, func(rep *wire.RollbackReply) { fmt.Fprintln(d.stdout, rep.Line) })
	}
}

// sbEgressCmd is `warren egress [--policy FILE] SANDBOX`, the daemon's
// spelling of the VM-level `warren egress [--policy FILE] API`: it prints
// the JSON answer, with or without --json.
func sbEgressCmd(d *daemonCmd) func() int {
	pol := d.fs.String("policy", "", "replace the sandbox's egress policy with this one (JSON)")
	return func() int {
		var rep *wire.EgressReply
		var err error
		if *pol == "" {
			rep, err = d.c.Egress(d.ctx, d.id)
		} else if b, rerr := client.ReadPolicy(*pol); rerr != nil {
			err = rerr
		} else {
			rep, err = d.c.SetEgress(d.ctx, d.id, b)
		}
		return show(d, rep, err, func(rep *wire.EgressReply) { printJSON(d.stdout, rep) })
	}
}

const sbBalloonUsage = "balloon [--target MiB] [--stats-interval S] SANDBOX\n\n" +
	"prints the memory balloon of a sandbox whose template was created with --balloon: its target,\n" +
	"what the guest's driver holds, the guest's latest memory statistics and the device's counters.\n" +
	"--target sets how much of the guest's memory the balloon takes (0 gives it all back; at most the\n" +
	"guest's memory), --stats-interval how often the guest is asked for statistics (0: never), first"

// sbBalloonCmd is `warren balloon [--target MiB] [--stats-interval S]
// SANDBOX`: the sandbox's balloon, changed first when a flag says so.
func sbBalloonCmd(d *daemonCmd) func() int {
	target := d.fs.Uint64("target", 0, "set the balloon's target: MiB of the guest's memory it takes (0: none)")
	interval := d.fs.Uint64("stats-interval", 0, "set how often, in seconds, the guest is asked for memory statistics (0: never)")
	return func() int {
		var req vmmctl.BalloonRequest
		d.fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "target":
				req.TargetMiB = target
			case "stats-interval":
				req.StatsIntervalS = interval
			}
		})
		var rep *vmmctl.BalloonReply
		var err error
		if req.TargetMiB == nil && req.StatsIntervalS == nil {
			rep, err = d.c.Balloon(d.ctx, d.id)
		} else {
			rep, err = d.c.SetBalloon(d.ctx, d.id, req)
		}
		return show(d, rep, err, func(rep *vmmctl.BalloonReply) { printBalloon(d.stdout, rep) })
	}
}

// printBalloon writes rep for people: the target, the balloon's size,
// the driver's features, the guest's statistics and the counters.
func printBalloon(w io.Writer, rep *vmmctl.BalloonReply) {
	yes := map[bool]string{true: "yes", false: "no"}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "target:\t%d MiB (%d pages)\n", rep.TargetMiB, rep.TargetPages)
	fmt.Fprintf(tw, "actual:\t%d MiB (%d pages)\n", rep.ActualMiB, rep.ActualPages)
	fmt.Fprintf(tw, "driver active:\t%s\n", yes[rep.Active])
	fmt.Fprintf(tw, "free page reporting:\t%s\n", yes[rep.FreePageReporting])
	fmt.Fprintf(tw, "statistics queue:\t%s\n", yes[rep.StatsQueue])
	every := "never"
	if rep.StatsIntervalS > 0 {
		every = "every " + (time.Duration(rep.StatsIntervalS * float64(time.Second))).String()
	}
	fmt.Fprintf(tw, "statistics:\t%s", every)
	if !rep.StatsTime.IsZero() {
		fmt.Fprintf(tw, ", latest at %s", rep.StatsTime.Local().Format("15:04:05"))
	}
	fmt.Fprintln(tw)
	for _, st := range rep.Stats {
		name := st.Name
		if name == "" {
			name = fmt.Sprintf("tag %d", st.Tag)
		}
		fmt.Fprintf(tw, "  %s\t%d\n", name, st.Value)
	}
	c := rep.Counters
	fmt.Fprintln(tw, "counters:")
	for _, kv := range []struct {
		name string
		v    uint64
	}{
		{"inflated pages", c.InflatedPages}, {"deflated pages", c.DeflatedPages}, {"inflated pages discarded", c.InflateDiscardedPages},
		{"free page reports", c.Reports}, {"reported bytes", c.ReportedBytes}, {"reported bytes discarded", c.ReportDiscardedBytes},
		{"statistics updates", c.StatsUpdates}, {"errors", c.Errors}, {"discard errors", c.DiscardErrors},
	} {
		fmt.Fprintf(tw, "  %s\t%d\n", kv.name, kv.v)
	}
	tw.Flush()
}
