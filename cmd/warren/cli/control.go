package cli

// The VM-level verbs that talk to a running VMM through its control API
// (vmmctl: pause, resume, snapshot, rollback, fork, egress), and those
// that work on a VMM's files offline (compact, flatten).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// rollbackCmd is `warren rollback API DIR/NAME`.
func rollbackCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren rollback", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		fmt.Fprint(stderr, "usage: warren rollback API DIR/NAME\n\nputs the running VM whose control socket is API back to the snapshot DIR/NAME,\nin place: same process, sockets and identity; only pages that changed are rewritten.\n")
		return 2
	}
	path, err := filepath.Abs(fs.Arg(1))
	if err == nil {
		_, _, _, err = vmsnap.Paths(path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren rollback: %v\n", err)
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	var r vmmctl.RollbackReply
	if err := apiCall(ctx, fs.Arg(0), "rollback", vmmctl.RollbackRequest{Path: path}, &r); err != nil {
		fmt.Fprintf(stderr, "warren rollback: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, r.Line)
	return 0
}

// pauseCmd is `warren pause API` and `warren resume API`.
func pauseCmd(verb string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "usage: warren %s API\n\nAPI is the VM's control socket (warren run --api PATH).\n", verb)
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	var r vmmctl.PauseReply
	if err := apiCall(ctx, fs.Arg(0), verb, struct{}{}, &r); err != nil {
		fmt.Fprintf(stderr, "warren %s: %v\n", verb, err)
		return 1
	}
	fmt.Fprintf(stdout, "paused=%v\n", r.Paused)
	return 0
}

// snapshotCmd is `warren snapshot [--incremental] [--every D --max-chain N] API DIR/NAME`.
func snapshotCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren snapshot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: warren snapshot [--incremental] [--every D [--max-chain N] [--count N]] API DIR/NAME\n\n"+
			"API is the VM's control socket (warren run --api PATH). With --every, snapshots\n"+
			"DIR/NAME-0001, DIR/NAME-0002, ... are taken every D: a full one, then incremental\n"+
			"ones, and a full one again once the chain has --max-chain layers.\n\n")
		fs.PrintDefaults()
	}
	incremental := fs.Bool("incremental", false, "store only the pages written since the VM's previous snapshot (in the same DIR)")
	every := fs.Duration("every", 0, "keep taking snapshots at this interval until interrupted")
	maxChain := fs.Int("max-chain", 8, "with --every: most layers in a chain before a new full snapshot")
	count := fs.Int("count", 0, "with --every: stop after this many snapshots (0: when interrupted)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 || *every < 0 || *maxChain < 1 || *count < 0 {
		fs.Usage()
		return 2
	}
	sock := fs.Arg(0)
	path, err := filepath.Abs(fs.Arg(1))
	if err == nil {
		_, _, _, err = vmsnap.Paths(path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren snapshot: %v\n", err)
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	take := func(p string, kind vmsnap.Kind) error {
		var r vmmctl.SnapshotReply
		if err := apiCall(ctx, sock, "snapshot", vmmctl.SnapshotRequest{Path: p, Kind: kind}, &r); err != nil {
			return err
		}
		fmt.Fprintln(stdout, r.Line)
		return nil
	}
	kind := vmsnap.Full
	if *incremental {
		kind = vmsnap.Incremental
	}
	if *every == 0 {
		if err := take(path, kind); err != nil {
			fmt.Fprintf(stderr, "warren snapshot: %v\n", err)
			return 1
		}
		return 0
	}
	chain := 0 // layers in the current chain; 0 before the first snapshot
	if *incremental {
		chain = 1 // the VM's previous snapshot is the chain's first layer, as far as we know
	}
	for seq := 1; ; seq++ {
		if chain == 0 || chain >= *maxChain {
			kind, chain = vmsnap.Full, 0
		} else {
			kind = vmsnap.Incremental
		}
		if err := take(fmt.Sprintf("%s-%04d", path, seq), kind); err != nil {
			if ctx.Err() != nil {
				return 0
			}
			fmt.Fprintf(stderr, "warren snapshot: %v\n", err)
			return 1
		}
		chain++
		if seq == *count {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(*every):
		}
	}
}

// compactCmd is `warren compact DIR/NAME DIR/NEW`.
func compactCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren compact", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		fmt.Fprint(stderr, "usage: warren compact DIR/NAME DIR/NEW\n\nwrites one full snapshot NEW equal to NAME (its memory chain merged, and each disk's own\nlayers merged into one overlay beside them).\n")
		return 2
	}
	res, err := vmsnap.Compact(fs.Arg(0), fs.Arg(1), nil)
	if err != nil {
		fmt.Fprintf(stderr, "warren compact: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "full %s: %d pages, layer %d bytes (%s)\n", res.StatePath, res.Pages, res.LayerBytes, filepath.Base(res.LayerPath))
	if s, err := vmsnap.Load(res.StatePath, nil); err == nil {
		for _, d := range s.Disks {
			fmt.Fprintf(stdout, "disk %d: layer %s (%d images in its chain)\n", d.Index, d.Layer, len(d.Chain))
		}
		s.Close()
	}
	return 0
}

// apiCall POSTs req to /v1/VERB of the control API at sock and decodes
// the answer into resp.
func apiCall(ctx context.Context, sock, verb string, req, resp any) error {
	return vmmctl.Client{Socket: sock}.Call(ctx, verb, req, resp)
}

// forkCmd is `warren fork [-n N] [--prefix PATH] API`.
func forkCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren fork", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: warren fork [-n N] [--prefix PATH] [--netns] [--json] API\n\n"+
			"makes N running copy-on-write children of the running VM whose control socket\n"+
			"is API. Child K serves its control API on PREFIX-K.api and its agent on\n"+
			"PREFIX-K.vsock (with vsock), and has its own CID, hostname and machine id.\n\n")
		fs.PrintDefaults()
	}
	n := fs.Int("n", 1, "number of children")
	prefix := fs.String("prefix", "", "path prefix of the children's sockets and files (default: beside API)")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	netns := fs.Bool("netns", false, "start each child in a new network namespace, with its tap there (needs a VM with a tap)")
	egressFile := fs.String("egress", "", "the children's egress policy (JSON), narrowing the parent's (default: the parent's)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var childPolicy *policy.Policy
	if *egressFile != "" {
		// (The parent VM checks it with its operator's allowances.)
		p, err := policy.LoadWith(*egressFile, policy.Options{WildcardCredentials: true})
		if err != nil {
			fmt.Fprintf(stderr, "warren fork: %v\n", err)
			return 2
		}
		childPolicy = &p
	}
	if fs.NArg() != 1 || *n < 1 || *n > vmmctl.MaxForkChildren {
		fs.Usage()
		return 2
	}
	if *prefix != "" {
		p, err := filepath.Abs(*prefix)
		if err != nil {
			fmt.Fprintf(stderr, "warren fork: %v\n", err)
			return 2
		}
		*prefix = p
	}
	ctx, stop := interruptContext()
	defer stop()
	var r vmmctl.ForkReply
	if err := apiCall(ctx, fs.Arg(0), "fork", vmmctl.ForkRequest{N: *n, Prefix: *prefix, NetNS: *netns, Egress: childPolicy}, &r); err != nil {
		fmt.Fprintf(stderr, "warren fork: %v\n", err)
		return 1
	}
	if *asJSON {
		json.NewEncoder(stdout).Encode(r)
		return 0
	}
	fmt.Fprintf(stdout, "forked %d children: parent paused %.1f ms, total %.1f ms, memory in %d layers\n", len(r.Children), r.PauseMS, r.TotalMS, r.Layers)
	for _, c := range r.Children {
		fmt.Fprintf(stdout, "child %d: pid %d api %s vsock %s cid %d hostname %s running after %.1f ms\n",
			c.Index, c.PID, c.API, c.Vsock, c.CID, c.Hostname, c.ReadyMS)
	}
	return 0
}

// egressCmd is `warren egress API [--policy FILE]`.
func egressCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren egress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pol := fs.String("policy", "", "replace the running VM's egress policy with this one (JSON)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprint(stderr, "usage: warren egress [--policy FILE] API\n\nprints the egress policy in force and the filter, proxy and audit counters of the VM\nwhose control socket is API; with --policy, replaces the policy first (live).\n")
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	c := vmmctl.Client{Socket: fs.Arg(0)}
	var rep *vmmctl.EgressReply
	var err error
	if *pol != "" {
		var b []byte
		if b, err = os.ReadFile(*pol); err == nil {
			// (The VM checks it with its operator's allowances.)
			if _, err = policy.ParseWith(b, policy.Options{WildcardCredentials: true}); err == nil {
				rep, err = c.SetEgress(ctx, b)
			}
		}
	} else {
		rep, err = c.Egress(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren egress: %v\n", err)
		return 1
	}
	out, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Fprintln(stdout, string(out))
	return 0
}

// flattenCmd is `warren flatten OVERLAY OUT`: it writes the disk that a
// copy-on-write overlay (a fork's disk) and the images under it make up as
// one raw image OUT, which no longer depends on them.
func flattenCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprint(stderr, "usage: warren flatten OVERLAY OUT\n\nwrites the disk an overlay (DISK.<id>.wcow, made by warren fork) shows as one raw image OUT.\n")
		return 2
	}
	o, err := disk.OpenChain(args[0], true)
	if err != nil {
		fmt.Fprintf(stderr, "warren flatten: %v\n", err)
		return 1
	}
	defer o.Close()
	if err := disk.Flatten(o, args[1]); err != nil {
		fmt.Fprintf(stderr, "warren flatten: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "flattened %s (%d bytes) to %s\n", args[0], o.Size(), args[1])
	return 0
}
