package cli

// The VM-level verbs that talk to a running VMM through its control API
// (vmmctl: pause, resume, snapshot, rollback, fork, egress), those that
// work on a VMM's files offline (compact, flatten), and the driver every
// table-driven VM-level verb runs under (vmCmd).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// A vmVerb is one row of vmVerbs: its usage (after "usage: warren "),
// how many operands it takes (-1: its run checks them), and setup, which
// defines its flags on c.fs and returns what runs it once they are parsed.
type vmVerb struct {
	usage string
	nargs int
	setup func(c *vmCmd) func() int
}

// apiNote ends the usage of the verbs whose operand is a control socket.
const apiNote = "\n\nAPI is the VM's control socket (warren run --api PATH)."

// vmVerbs are the VM-level verbs that have a flag set, by name.
var vmVerbs = map[string]vmVerb{
	"exec":   {"exec [flags] VM -- PROGRAM [ARGS...]\n\nVM is the path of the VM's vsock socket (warren run --vsock).", -1, execCmd},
	"cp":     {"cp SRC DST\n\nOne of SRC and DST is VM:/guest/path (VM: the vsock socket path); the other a host path or - (stdin/stdout).", 2, cpCmd},
	"health": {"health [--wait D] VM", 1, healthCmd},
	"pause":  {"pause API" + apiNote, 1, pauseCmd("pause")},
	"resume": {"resume API" + apiNote, 1, pauseCmd("resume")},
	"snapshot": {"snapshot [--incremental] [--every D [--max-chain N] [--count N]] API DIR/NAME\n\n" +
		"API is the VM's control socket (warren run --api PATH). With --every, snapshots\n" +
		"DIR/NAME-0001, DIR/NAME-0002, ... are taken every D: a full one, then incremental\n" +
		"ones, and a full one again once the chain has --max-chain layers.", 2, snapshotCmd},
	"rollback": {"rollback API DIR/NAME\n\nputs the running VM whose control socket is API back to the snapshot DIR/NAME,\n" +
		"in place: same process, sockets and identity; only pages that changed are rewritten.", 2, rollbackCmd},
	"fork": {"fork [-n N] [--prefix PATH] [--netns] [--json] API\n\n" +
		"makes N running copy-on-write children of the running VM whose control socket\n" +
		"is API. Child K serves its control API on PREFIX-K.api and its agent on\n" +
		"PREFIX-K.vsock (with vsock), and has its own CID, hostname and machine id.", -1, forkCmd},
	"egress": {"egress [--policy FILE] API\n\nprints the egress policy in force and the filter, proxy and audit counters of the VM\n" +
		"whose control socket is API; with --policy, replaces the policy first (live).", 1, egressCmd},
	"compact": {"compact DIR/NAME DIR/NEW\n\nwrites one full snapshot NEW equal to NAME (its memory chain merged, and each disk's own\n" +
		"layers merged into one overlay beside them).", 2, compactCmd},
	"describe": {"describe DIR/NAME\n\nprints what the snapshot DIR/NAME holds of its guest's liveness: each vCPU's RIP, interrupt\n" +
		"flag, MP state, pending events, local APIC vectors and timer; the PIC and IOAPIC; and each\n" +
		"virtqueue's saved indices against its rings in the snapshot's memory (a silent guest's why).", 1, describeCmd},
	"flatten": {"flatten OVERLAY OUT\n\nwrites the disk an overlay (DISK.<id>.wcow, made by warren fork) shows as one raw image OUT.", 2, flattenCmd},
}

// vmCmd is what every VM-level verb of vmVerbs shares: its flags, usage,
// streams, error reports and the interrupt context of its calls.
type vmCmd struct {
	name           string // "warren VERB"
	fs             *flag.FlagSet
	stdin          io.Reader
	stdout, stderr io.Writer
	ctx            context.Context // made by context, cancelled by Ctrl-C or SIGTERM
	stop           context.CancelFunc
}

// runVM runs verb (a row of vmVerbs) with args: a usage error exits 2.
func (a *app) runVM(verb string, v vmVerb, args []string) int {
	c := &vmCmd{name: "warren " + verb, stdin: a.stdin, stdout: a.stdout, stderr: a.stderr}
	c.fs = flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.fs.SetOutput(a.stderr)
	run := v.setup(c)
	hasFlags := false
	c.fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	c.fs.Usage = func() {
		fmt.Fprintf(a.stderr, "usage: warren %s\n", v.usage)
		if hasFlags {
			fmt.Fprintln(a.stderr)
			c.fs.PrintDefaults()
		}
	}
	if err := c.fs.Parse(args); err != nil {
		return 2
	}
	if v.nargs >= 0 && c.fs.NArg() != v.nargs {
		return c.usageErr()
	}
	defer func() {
		if c.stop != nil {
			c.stop()
		}
	}()
	return run()
}

func (c *vmCmd) usageErr() int {
	c.fs.Usage()
	return 2
}

// fail reports err and returns 1.
func (c *vmCmd) fail(err error) int { return c.failCode(1, err) }

// failCode reports err and returns code.
func (c *vmCmd) failCode(code int, err error) int {
	fmt.Fprintf(c.stderr, "%s: %v\n", c.name, err)
	return code
}

// printJSON reports err (exit 1), or prints v as indented JSON.
func (c *vmCmd) printJSON(v any, err error) int {
	if err != nil {
		return c.fail(err)
	}
	printJSON(c.stdout, v)
	return 0
}

// context returns the verb's interrupt context (only the verbs that talk
// to a VM have one: the others die of Ctrl-C as they always did).
func (c *vmCmd) context() context.Context {
	if c.ctx == nil {
		c.ctx, c.stop = interruptContext()
	}
	return c.ctx
}

// call POSTs req to /v1/VERB of the control API at the verb's first
// operand and decodes the answer into resp.
func (c *vmCmd) call(verb string, req, resp any) error {
	return vmmctl.Client{Socket: c.fs.Arg(0)}.Call(c.context(), verb, req, resp)
}

// snapshotPath is a snapshot operand, DIR/NAME, made absolute and checked.
func snapshotPath(arg string) (string, error) {
	path, err := filepath.Abs(arg)
	if err == nil {
		_, _, _, err = vmsnap.Paths(path)
	}
	return path, err
}

// rollbackCmd is `warren rollback API DIR/NAME`.
func rollbackCmd(c *vmCmd) func() int {
	return func() int {
		path, err := snapshotPath(c.fs.Arg(1))
		if err != nil {
			return c.failCode(2, err)
		}
		var r vmmctl.RollbackReply
		if err := c.call("rollback", vmmctl.RollbackRequest{Path: path}, &r); err != nil {
			return c.fail(err)
		}
		fmt.Fprintln(c.stdout, r.Line)
		return 0
	}
}

// pauseCmd is `warren pause API` and `warren resume API` (verb).
func pauseCmd(verb string) func(c *vmCmd) func() int {
	return func(c *vmCmd) func() int {
		return func() int {
			var r vmmctl.PauseReply
			if err := c.call(verb, struct{}{}, &r); err != nil {
				return c.fail(err)
			}
			fmt.Fprintf(c.stdout, "paused=%v\n", r.Paused)
			return 0
		}
	}
}

// snapshotCmd is `warren snapshot [--incremental] [--every D --max-chain N] API DIR/NAME`.
func snapshotCmd(c *vmCmd) func() int {
	incremental := c.fs.Bool("incremental", false, "store only the pages written since the VM's previous snapshot (in the same DIR)")
	every := c.fs.Duration("every", 0, "keep taking snapshots at this interval until interrupted")
	maxChain := c.fs.Int("max-chain", 8, "with --every: most layers in a chain before a new full snapshot")
	count := c.fs.Int("count", 0, "with --every: stop after this many snapshots (0: when interrupted)")
	return func() int {
		if *every < 0 || *maxChain < 1 || *count < 0 {
			return c.usageErr()
		}
		path, err := snapshotPath(c.fs.Arg(1))
		if err != nil {
			return c.failCode(2, err)
		}
		vm := vmmctl.Client{Socket: c.fs.Arg(0)}
		if *every > 0 {
			sched := vmmctl.SnapshotSchedule{Every: *every, MaxChain: *maxChain, Count: *count, Incremental: *incremental}
			if err := vm.SnapshotEvery(c.context(), path, sched, func(r *vmmctl.SnapshotReply) { fmt.Fprintln(c.stdout, r.Line) }); err != nil {
				return c.fail(err)
			}
			return 0
		}
		kind := vmsnap.Full
		if *incremental {
			kind = vmsnap.Incremental
		}
		r, err := vm.Snapshot(c.context(), vmmctl.SnapshotRequest{Path: path, Kind: kind})
		if err != nil {
			return c.fail(err)
		}
		fmt.Fprintln(c.stdout, r.Line)
		return 0
	}
}

// compactCmd is `warren compact DIR/NAME DIR/NEW`.
func compactCmd(c *vmCmd) func() int {
	return func() int {
		res, err := vmsnap.Compact(c.fs.Arg(0), c.fs.Arg(1), nil)
		if err != nil {
			return c.fail(err)
		}
		fmt.Fprintf(c.stdout, "full %s: %d pages, layer %d bytes (%s)\n", res.StatePath, res.Pages, res.LayerBytes, filepath.Base(res.LayerPath))
		if s, err := vmsnap.Load(res.StatePath, nil); err == nil {
			for _, d := range s.Disks {
				fmt.Fprintf(c.stdout, "disk %d: layer %s (%d images in its chain)\n", d.Index, d.Layer, len(d.Chain))
			}
			s.Close()
		}
		return 0
	}
}

// describeCmd is `warren describe DIR/NAME`.
func describeCmd(c *vmCmd) func() int {
	return func() int {
		s, err := vmsnap.Load(c.fs.Arg(0), nil)
		if err != nil {
			return c.fail(err)
		}
		defer s.Close()
		fmt.Fprint(c.stdout, s.Describe())
		return 0
	}
}

// forkCmd is `warren fork [-n N] [--prefix PATH] API`.
func forkCmd(c *vmCmd) func() int {
	n := c.fs.Int("n", 1, "number of children")
	prefix := c.fs.String("prefix", "", "path prefix of the children's sockets and files (default: beside API)")
	asJSON := c.fs.Bool("json", false, "print the answer as JSON")
	netns := c.fs.Bool("netns", false, "start each child in a new network namespace, with its tap there (needs a VM with a tap)")
	egressFile := c.fs.String("egress", "", "the children's egress policy (JSON), narrowing the parent's (default: the parent's)")
	return func() int {
		var childPolicy *policy.Policy
		if *egressFile != "" {
			// (The parent VM checks it with its operator's allowances.)
			p, err := policy.LoadWith(*egressFile, policy.Options{WildcardCredentials: true})
			if err != nil {
				return c.failCode(2, err)
			}
			childPolicy = &p
		}
		if c.fs.NArg() != 1 || *n < 1 || *n > vmmctl.MaxForkChildren {
			return c.usageErr()
		}
		if *prefix != "" {
			p, err := filepath.Abs(*prefix)
			if err != nil {
				return c.failCode(2, err)
			}
			*prefix = p
		}
		var r vmmctl.ForkReply
		if err := c.call("fork", vmmctl.ForkRequest{N: *n, Prefix: *prefix, NetNS: *netns, Egress: childPolicy}, &r); err != nil {
			return c.fail(err)
		}
		if *asJSON {
			json.NewEncoder(c.stdout).Encode(r)
			return 0
		}
		fmt.Fprintf(c.stdout, "forked %d children: parent paused %.1f ms, total %.1f ms, memory in %d layers\n", len(r.Children), r.PauseMS, r.TotalMS, r.Layers)
		for _, k := range r.Children {
			fmt.Fprintf(c.stdout, "child %d: pid %d api %s vsock %s cid %d hostname %s running after %.1f ms\n",
				k.Index, k.PID, k.API, k.Vsock, k.CID, k.Hostname, k.ReadyMS)
		}
		return 0
	}
}

// egressCmd is `warren egress API [--policy FILE]`.
func egressCmd(c *vmCmd) func() int {
	pol := c.fs.String("policy", "", "replace the running VM's egress policy with this one (JSON)")
	return func() int {
		vm := vmmctl.Client{Socket: c.fs.Arg(0)}
		if *pol != "" {
			return c.printJSON(vm.SetEgressFile(c.context(), *pol))
		}
		return c.printJSON(vm.Egress(c.context()))
	}
}

// flattenCmd is `warren flatten OVERLAY OUT`: it writes the disk that a
// copy-on-write overlay (a fork's disk) and the images under it make up as
// one raw image OUT, which no longer depends on them.
func flattenCmd(c *vmCmd) func() int {
	return func() int {
		o, err := disk.OpenChain(c.fs.Arg(0), true)
		if err != nil {
			return c.fail(err)
		}
		defer o.Close()
		if err := disk.Flatten(o, c.fs.Arg(1)); err != nil {
			return c.fail(err)
		}
		fmt.Fprintf(c.stdout, "flattened %s (%d bytes) to %s\n", c.fs.Arg(0), o.Size(), c.fs.Arg(1))
		return 0
	}
}

// printJSON prints v as indented JSON and a newline.
func printJSON(w io.Writer, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Fprintf(w, "%s\n", b)
}
