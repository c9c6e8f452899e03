package cli

// The warren verbs that talk to warren-hostd (hostd/openapi.yaml), and
// the routing between them and the VM-level verbs of the same names: a
// verb whose target is a VM's socket path (an existing socket, or an
// argument that looks like a path) runs the VM-level code, as it always
// did; `warren vm VERB ...` always does.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

const daemonUsage = `usage: warren <command> [flags]

Sandboxes, through the host daemon (warren-hostd):
  templates                 list templates; templates create --kernel K [--initramfs I] [--disk D]...
                            [--mem MiB] [--cpus N] [--cmdline S] [--network]; templates rm ID...
                            templates create --image REF|oci-layout:DIR[:TAG]|docker-archive:FILE
                            (or --rootfs DIR|FILE.tar) [--disk-mib N] [--insecure-registry]
                            [--start-cmd CMD | --start-image-cmd] [--ready-cmd CMD]: a root file
                            system from an image (local sources are uploaded)
  images                    the tenant's image bases (one per image digest); images rm KEY...
  create    [--template ID] [--mem MiB] [--cpus N] [--name NAME] [--env K=V]...
            [--egress POLICY.json] [--secret NAME]...                             prints the sandbox id
  ls                        list sandboxes
  exec      [--timeout D] [--cwd DIR] [--env K=V] [-i] SANDBOX -- PROGRAM [ARGS...]
  cp        SRC DST         one side SANDBOX:/guest/path, the other a host path or -
  pause     [--to-disk] SANDBOX
  resume    SANDBOX
  snapshot  [--incremental] [--name N] SANDBOX; snapshot --every 60s [--keep N] SANDBOX;
            snapshot --every 0 SANDBOX (stop); snapshot --list SANDBOX
  fork      [-n N] SANDBOX  prints the children's ids
  rollback  SANDBOX SNAPSHOT
  rm        SANDBOX...
  egress    [--policy FILE] SANDBOX   a network sandbox's egress policy and counters; --policy replaces it
  secrets                   list the tenant's secrets (names); secrets set NAME [FILE|-] (value from
                            FILE or stdin, one trailing newline dropped); secrets rm NAME...
  keys                      the tenant's encryption key (warren-hostd --keys): its ID, or "revoked";
                            keys create (seals the tenant's snapshots and idle disks under a new key);
                            keys revoke --yes (crypto-shreds it: stops the tenant's sandboxes, and its
                            snapshots and disks can no longer be read)
  events                    stream lifecycle events

  Every daemon verb takes --host (default $WARREN_HOST, else /run/warren/hostd.sock:
  a unix socket path, or https://HOST:PORT (--ca-file $WARREN_CA, --client-cert
  $WARREN_CLIENT_CERT, --client-key $WARREN_CLIENT_KEY) or http://HOST:PORT, with the
  bearer token $WARREN_TOKEN),
  --tenant (default $WARREN_TENANT, else "default") and --json (full JSON answers).
  SANDBOX is a sandbox id (sb-...) or the name given to warren create --name.

VM-level verbs (research use: one VMM, addressed by its socket paths), also
spelled warren vm VERB ...: exec, cp, pause, resume, snapshot, fork, rollback and
egress run these when their target is a socket path (an existing socket, or a path
with a / or ending in .sock, .api or .vsock).

`

// daemonVerbs are the verbs that only exist against the daemon.
var daemonVerbs = map[string]bool{"images": true, "templates": true, "create": true, "ls": true, "rm": true, "events": true, "secrets": true, "keys": true}

// sharedVerbs are the verbs of both the daemon and the VM level.
var sharedVerbs = map[string]bool{"exec": true, "cp": true, "pause": true, "resume": true, "snapshot": true, "fork": true, "rollback": true, "egress": true}

// boolFlags are the flags, of either spelling of every verb, that take no
// value (to find the verbs' positional arguments before parsing).
var boolFlags = map[string]bool{"i": true, "json": true, "netns": true, "incremental": true, "to-disk": true,
	"list": true, "h": true, "help": true, "lazy": true, "network": true}

// daemonMain runs the daemon verbs and routes the shared ones; ok is
// false when args are the VM-level command's.
func daemonMain(args []string, stdin io.Reader, stdout, stderr io.Writer) (code int, ok bool) {
	// Leading --host, --tenant, --json and the TLS flags go to the daemon
	// verb after them.
	var global []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		name, _, hasVal := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		switch name {
		case "host", "tenant", "json", "ca-file", "client-cert", "client-key":
		default:
			name = ""
		}
		if name == "" {
			break
		}
		if hasVal || name == "json" {
			global, args = append(global, args[0]), args[1:]
		} else if len(args) > 1 {
			global, args = append(global, args[0], args[1]), args[2:]
		} else {
			break
		}
	}
	if len(global) > 0 {
		if len(args) == 0 || !daemonVerbs[args[0]] && !sharedVerbs[args[0]] {
			fmt.Fprintf(stderr, "warren: %s must come before a sandbox command\n%s", strings.Join(global, " "), daemonUsage)
			return 2, true
		}
		args = append([]string{args[0]}, append(global, args[1:]...)...)
	}
	verb, rest := args[0], args[1:]
	pos := positionals(rest)
	var vmLevel bool
	switch verb {
	case "vm":
		if len(rest) == 0 {
			fmt.Fprint(stderr, usage)
			return 2, true
		}
		return vmMain(rest, stdin, stdout, stderr), true
	case "help", "-h", "--help":
		fmt.Fprint(stdout, daemonUsage+usage)
		return 0, true
	case "exec", "pause", "resume", "fork", "egress":
		vmLevel = len(pos) > 0 && isVMTarget(pos[0])
	case "snapshot":
		vmLevel = len(pos) >= 2 || len(pos) == 1 && isVMTarget(pos[0])
	case "rollback":
		vmLevel = len(pos) >= 1 && isVMTarget(pos[0]) || len(pos) >= 2 && strings.Contains(pos[1], "/")
	case "cp":
		// The daemon's when a side names a sandbox; otherwise the VM
		// level's (whose errors say what a cp needs).
		vmLevel = true
		for _, a := range pos {
			if t, err := agentclient.ParseTarget(a); err == nil && t.InGuest() && !isVMTarget(t.VM) {
				vmLevel = false
			}
		}
		for _, a := range pos {
			if t, err := agentclient.ParseTarget(a); err == nil && t.InGuest() && isVMTarget(t.VM) {
				vmLevel = true
			}
		}
	default:
		if !daemonVerbs[verb] {
			return 0, false
		}
	}
	if vmLevel {
		return 0, false
	}
	if routeProbe {
		return 0, true
	}
	return daemonVerb(verb, rest, stdin, stdout, stderr), true
}

// routeProbe makes daemonMain only route (tests).
var routeProbe bool

// positionals returns the positional arguments in args before any "--",
// skipping flags and their values.
func positionals(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if len(a) > 1 && a[0] == '-' {
			name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !hasVal && !boolFlags[name] {
				i++
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

// isVMTarget reports whether s names a VM's socket rather than a sandbox.
func isVMTarget(s string) bool {
	if fi, err := os.Stat(s); err == nil && fi.Mode()&os.ModeSocket != 0 {
		return true
	}
	return strings.Contains(s, "/") || strings.HasSuffix(s, ".sock") || strings.HasSuffix(s, ".api") || strings.HasSuffix(s, ".vsock")
}

// daemonCmd is what every daemon verb shares: flags, the client, output.
type daemonCmd struct {
	name           string
	fs             *flag.FlagSet
	host, tenant   *string
	tls            client.TLS
	asJSON         *bool
	stdout, stderr io.Writer
	c              *client.Client
	ctx            context.Context
}

func newDaemonCmd(ctx context.Context, verb, usageLine string, stdout, stderr io.Writer) *daemonCmd {
	d := &daemonCmd{name: "warren " + verb, stdout: stdout, stderr: stderr, ctx: ctx}
	d.fs = flag.NewFlagSet(d.name, flag.ContinueOnError)
	d.fs.SetOutput(stderr)
	d.fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: warren %s\n\n", usageLine)
		d.fs.PrintDefaults()
	}
	host := os.Getenv("WARREN_HOST")
	if host == "" {
		host = client.DefaultSocket
	}
	tenant := os.Getenv("WARREN_TENANT")
	d.host = d.fs.String("host", host, "the daemon: a unix socket path, or https://HOST:PORT or http://HOST:PORT (token in $WARREN_TOKEN) ($WARREN_HOST)")
	d.fs.StringVar(&d.tls.CAFile, "ca-file", os.Getenv("WARREN_CA"), "https daemon: PEM roots its certificate must chain to, instead of the system's ($WARREN_CA)")
	d.fs.StringVar(&d.tls.CertFile, "client-cert", os.Getenv("WARREN_CLIENT_CERT"), "https daemon with mutual TLS: this client's PEM certificate ($WARREN_CLIENT_CERT)")
	d.fs.StringVar(&d.tls.KeyFile, "client-key", os.Getenv("WARREN_CLIENT_KEY"), "the PEM key of --client-cert ($WARREN_CLIENT_KEY)")
	d.tenant = d.fs.String("tenant", tenant, "the tenant to act as ($WARREN_TENANT; default \"default\" on the unix socket)")
	d.asJSON = d.fs.Bool("json", false, "print the daemon's full JSON answers")
	return d
}

// parse parses args and connects; code is non-zero on a usage error.
func (d *daemonCmd) parse(args []string) (code int) {
	if err := d.fs.Parse(args); err != nil {
		return 2
	}
	t := d.tls
	if !strings.HasPrefix(*d.host, "https://") {
		// $WARREN_CA and friends only apply to https daemons; the flags,
		// given for another, are an error (NewTLS's).
		t = client.TLS{}
		d.fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "ca-file", "client-cert", "client-key":
				t = d.tls
			}
		})
	}
	c, err := client.NewTLS(*d.host, *d.tenant, os.Getenv("WARREN_TOKEN"), t)
	if err != nil {
		fmt.Fprintf(d.stderr, "%s: %v\n", d.name, err)
		return 2
	}
	d.c = c
	return 0
}

func (d *daemonCmd) usageErr() int {
	d.fs.Usage()
	return 2
}

func (d *daemonCmd) fail(err error) int {
	fmt.Fprintf(d.stderr, "%s: %v\n", d.name, err)
	return 1
}

func (d *daemonCmd) printJSON(v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Fprintf(d.stdout, "%s\n", b)
}

// parseSandbox parses args, which must leave exactly nArgs positionals,
// the first a sandbox reference, and returns the sandbox's id; a non-zero
// code (a usage error, 2, or a failure, 1, already reported) is the
// verb's exit status.
func (d *daemonCmd) parseSandbox(args []string, nArgs int) (id string, code int) {
	if code := d.parse(args); code != 0 {
		return "", code
	}
	if d.fs.NArg() != nArgs {
		return "", d.usageErr()
	}
	id, err := d.resolve(d.fs.Arg(0))
	if err != nil {
		return "", d.fail(err)
	}
	return id, 0
}

// resolve turns a sandbox reference (id or name) into its id.
func (d *daemonCmd) resolve(ref string) (string, error) { return d.c.Resolve(d.ctx, ref) }

// progress returns the display of a long operation's steps on stderr: on
// a terminal one line rewritten in place, otherwise one line a step; done
// ends it.
func (d *daemonCmd) progress(what string) (fn client.ProgressFunc, done func()) {
	tty := isTerminal(d.stderr)
	shown := false
	fn = func(p wire.Progress) {
		if tty {
			fmt.Fprintf(d.stderr, "\r\033[K%s: %s %3d%%", what, p.Step, p.Pct)
			shown = true
			return
		}
		fmt.Fprintf(d.stderr, "%s: [%3d%%] %s\n", what, p.Pct, p.Step)
	}
	return fn, func() {
		if shown {
			fmt.Fprint(d.stderr, "\r\033[K")
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}

// daemonCmds run the verbs that talk to warren-hostd, by name.
var daemonCmds = map[string]func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int{
	"templates": withoutStdin(templatesCmd),
	"images":    withoutStdin(imagesCmd),
	"create":    withoutStdin(createCmd),
	"ls":        withoutStdin(lsCmd),
	"rm":        withoutStdin(rmCmd),
	"events":    withoutStdin(eventsCmd),
	"secrets":   secretsCmd,
	"keys":      withoutStdin(keysCmd),
	"egress":    withoutStdin(sbEgressCmd),
	"exec":      sbExecCmd,
	"cp":        sbCpCmd,
	"pause":     withoutStdin(sbPauseCmd),
	"resume":    withoutStdin(sbResumeCmd),
	"snapshot":  withoutStdin(sbSnapshotCmd),
	"fork":      withoutStdin(sbForkCmd),
	"rollback":  withoutStdin(sbRollbackCmd),
}

// withoutStdin adapts a verb that reads no input to daemonCmds' shape.
func withoutStdin(f func(ctx context.Context, args []string, stdout, stderr io.Writer) int) func(context.Context, []string, io.Reader, io.Writer, io.Writer) int {
	return func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
		return f(ctx, args, stdout, stderr)
	}
}

func daemonVerb(verb string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	run, ok := daemonCmds[verb]
	if !ok {
		fmt.Fprintf(stderr, "warren: unknown command %q\n", verb)
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	return run(ctx, args, stdin, stdout, stderr)
}

func templatesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sub, args := subcommand(args, "ls")
	switch sub {
	case "ls", "list":
		return listTable(ctx, "templates", "templates [ls]", args, stdout, stderr, (*client.Client).Templates,
			"ID\tSTATUS\tMEM\tCPUS\tKERNEL\tBUILD\tCREATED", func(t client.Template) string {
				return fmt.Sprintf("%s\t%s\t%d\t%d\t%s\t%.0f ms\t%s", t.ID, t.Status, t.MemMiB, t.CPUs, filepath.Base(t.Kernel), t.BuildMS, ago(t.Created))
			})
	case "create":
		d := newDaemonCmd(ctx, "templates create", "templates create {--kernel K [--initramfs I] | --image REF | --rootfs DIR|FILE.tar} [--disk D]... [--mem MiB] [--cpus N] [--cmdline S] [--network]\n"+
			"    [--disk-mib N] [--insecure-registry] [--start-cmd CMD | --start-image-cmd] [--ready-cmd CMD] [--ready-timeout D]", stdout, stderr)
		kernel := d.fs.String("kernel", "", "guest kernel: the name of a vmlinux or bzImage in the daemon's guest directory (warren-hostd --guest-dir; required without --image/--rootfs, whose default is the daemon's)")
		imageRef := d.fs.String("image", "", "make the root file system from an image: a registry reference (pulled by the daemon), oci-layout:DIR[:TAG] or docker-archive:FILE.tar (read here and uploaded)")
		rootfs := d.fs.String("rootfs", "", "make the root file system from a plain tree: a directory or a tar file (read here and uploaded)")
		insecure := d.fs.Bool("insecure-registry", false, "pull --image over plain HTTP (a registry the daemon's operator allows, e.g. on loopback)")
		diskMiB := d.fs.Int("disk-mib", 0, "size of the image's root file system in MiB (sparse; default the daemon's, 4096)")
		startCmd := d.fs.String("start-cmd", "", "a shell command started (and kept running) in the template before its snapshot, so it runs in every sandbox")
		startImage := d.fs.Bool("start-image-cmd", false, "run the image's own Entrypoint and Cmd as the start command")
		readyCmd := d.fs.String("ready-cmd", "", "a shell command run until it exits 0 before the snapshot (with a start command)")
		readyTimeout := d.fs.Duration("ready-timeout", 0, "how long --ready-cmd may take (default 2m)")
		initramfs := d.fs.String("initramfs", "", "initramfs (cpio): a name in the daemon's guest directory")
		var disks stringsFlag
		d.fs.Var(&disks, "disk", "a raw disk image of the daemon's guest directory, NAME[,ro]: copied into the template; ,ro shared read-only by every sandbox, else each sandbox writes to a copy-on-write overlay of its own (repeatable)")
		mem := d.fs.Int("mem", 0, "guest memory in MiB (daemon default 256)")
		cpus := d.fs.Int("cpus", 0, "vCPUs (daemon default 1)")
		cmdline := d.fs.String("cmdline", "", "extra kernel command-line arguments")
		network := d.fs.Bool("network", false, "give the template's sandboxes a private network with filtered egress (deny all until a sandbox's --egress policy)")
		if code := d.parse(args); code != 0 {
			return code
		}
		if d.fs.NArg() != 0 || (*kernel == "" && *imageRef == "" && *rootfs == "") || (*imageRef != "" && *rootfs != "") {
			return d.usageErr()
		}
		// Names of files in the daemon's guest directory, sent as they
		// are: the daemon never opens a host path a client names.
		req := wire.TemplateRequest{Kernel: *kernel, Initramfs: *initramfs, Disks: disks, MemMiB: *mem, CPUs: *cpus, Cmdline: *cmdline, Network: *network}
		req.DiskMiB, req.InsecureRegistry, req.StartCmd, req.StartImageCmd, req.ReadyCmd = *diskMiB, *insecure, *startCmd, *startImage, *readyCmd
		req.ReadyTimeoutS = int(readyTimeout.Seconds())
		fn, done := d.progress("template")
		if *imageRef != "" || *rootfs != "" {
			ref, err := imageForTemplate(ctx, d.c, *imageRef, *rootfs, fn)
			if err != nil {
				done()
				return d.fail(err)
			}
			req.Image = ref
		}
		t, err := d.c.CreateTemplate(ctx, req, fn)
		done()
		if err != nil {
			return d.fail(err)
		}
		if *d.asJSON {
			d.printJSON(t)
		} else {
			fmt.Fprintln(stdout, t.ID)
		}
		return 0
	case "rm", "delete":
		d := newDaemonCmd(ctx, "templates rm", "templates rm ID...", stdout, stderr)
		return d.forEachArg(args, func(id string) (string, error) { return id, d.c.DeleteTemplate(ctx, id) })
	}
	fmt.Fprintf(stderr, "warren templates: unknown sub-command %q (ls, create, rm)\n", sub)
	return 2
}

// orDash is s, or "-" for an empty s (table cells).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func createCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "create", "create [--template ID] [--mem MiB] [--cpus N] [--name NAME] [--env K=V]... [--label K=V]... [--egress FILE] [--secret NAME]...", stdout, stderr)
	tpl := d.fs.String("template", "", "the template (default: the tenant's only ready template)")
	mem := d.fs.Int("mem", 0, "the VMM's memory limit in MiB (default: the template's guest memory)")
	cpus := d.fs.Int("cpus", 0, "the VMM's CPU limit (default: the template's vCPUs)")
	name := d.fs.String("name", "", "a name for the sandbox (its \"name\" label), usable instead of its id")
	egress := d.fs.String("egress", "", "the sandbox's egress policy (JSON; needs a --network template)")
	var env, labels, secrets stringsFlag
	d.fs.Var(&env, "env", "KEY=VALUE set in every exec (repeatable)")
	d.fs.Var(&labels, "label", "KEY=VALUE label (repeatable)")
	d.fs.Var(&secrets, "secret", "a secret of the tenant (warren secrets set) the egress policy's credentials may use (repeatable)")
	if code := d.parseNone(args); code != 0 {
		return code
	}
	req := wire.SandboxRequest{Template: *tpl, MemMiB: *mem, CPUs: *cpus, Env: env, Secrets: secrets}
	if *egress != "" {
		b, err := readPolicy(*egress)
		if err != nil {
			return d.fail(err)
		}
		req.Egress = b
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			fmt.Fprintf(stderr, "warren create: --label %q is not KEY=VALUE\n", l)
			return 2
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[k] = v
	}
	if *name != "" {
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels["name"] = *name
	}
	if req.Template == "" {
		l, err := d.c.Templates(ctx)
		if err != nil {
			return d.fail(err)
		}
		var ready []string
		for _, t := range l {
			if t.Status == "ready" {
				ready = append(ready, t.ID)
			}
		}
		if len(ready) != 1 {
			return d.fail(fmt.Errorf("--template is needed: the tenant has %d ready templates", len(ready)))
		}
		req.Template = ready[0]
	}
	fn, done := d.progress("create")
	s, err := d.c.Create(ctx, req, fn)
	done()
	if err != nil {
		return d.fail(err)
	}
	if *d.asJSON {
		d.printJSON(s)
	} else {
		fmt.Fprintln(stdout, s.ID)
	}
	return 0
}

func lsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return listTable(ctx, "ls", "ls", args, stdout, stderr, (*client.Client).Sandboxes,
		"ID\tNAME\tSTATUS\tTEMPLATE\tPARENT\tPID\tMEM\tSNAPSHOTS\tCREATED", func(s client.Sandbox) string {
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
}

// listTable is a listing command (name, usage: no arguments): the list
// list fetches, as JSON with --json, else a table of header and one row
// per item.
func listTable[T any](ctx context.Context, name, usage string, args []string, stdout, stderr io.Writer,
	list func(*client.Client, context.Context) ([]T, error), header string, row func(T) string) int {
	d := newDaemonCmd(ctx, name, usage, stdout, stderr)
	if code := d.parseNone(args); code != 0 {
		return code
	}
	l, err := list(d.c, ctx)
	if err != nil {
		return d.fail(err)
	}
	if *d.asJSON {
		d.printJSON(l)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, x := range l {
		fmt.Fprintln(tw, row(x))
	}
	tw.Flush()
	return 0
}

func rmCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "rm", "rm SANDBOX...", stdout, stderr)
	return d.forEachArg(args, func(ref string) (string, error) {
		id, err := d.resolve(ref)
		if err == nil {
			err = d.c.Delete(ctx, id)
		}
		return id, err
	})
}

// forEachArg parses args, wants at least one operand, and runs do on each
// in turn: what do returns is printed, an error reported (the others still
// run; the exit code is then 1). For the verbs that delete by name.
func (d *daemonCmd) forEachArg(args []string, do func(arg string) (string, error)) int {
	if code := d.parse(args); code != 0 {
		return code
	}
	if d.fs.NArg() == 0 {
		return d.usageErr()
	}
	code := 0
	for _, a := range d.fs.Args() {
		out, err := do(a)
		if err != nil {
			code = d.fail(err)
			continue
		}
		fmt.Fprintln(d.stdout, out)
	}
	return code
}

func eventsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "events", "events", stdout, stderr)
	if code := d.parseNone(args); code != 0 {
		return code
	}
	enc := json.NewEncoder(stdout)
	err := d.c.Events(ctx, func(e wire.Event) bool {
		if *d.asJSON {
			return enc.Encode(e) == nil
		}
		subject := e.Sandbox
		if subject == "" {
			subject = e.Template
		}
		_, err := fmt.Fprintf(stdout, "%s %-16s %s %s\n", e.Time.Local().Format("15:04:05.000"), e.Type, subject, e.Detail)
		return err == nil
	})
	if err != nil && ctx.Err() == nil {
		return d.fail(err)
	}
	return 0
}

func sbExecCmd(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "exec", "exec [--timeout D] [--cwd DIR] [--env K=V]... [-i] SANDBOX -- PROGRAM [ARGS...]", stdout, stderr)
	timeout := d.fs.Duration("timeout", 0, "kill the process (and its process group) after this long (0: never)")
	cwd := d.fs.String("cwd", "", "working directory in the guest")
	interactive := d.fs.Bool("i", false, "send standard input (read to its end first) to the process")
	var env stringsFlag
	d.fs.Var(&env, "env", "set KEY=VALUE in the process's environment (repeatable)")
	if code := d.parse(args); code != 0 {
		return code
	}
	rest := d.fs.Args()
	if len(rest) < 3 || rest[1] != "--" || *timeout < 0 {
		return d.usageErr()
	}
	req := wire.ExecRequest{Argv: rest[2:], Env: env, Cwd: *cwd, TimeoutMS: timeout.Milliseconds()}
	if *timeout > 0 && req.TimeoutMS == 0 {
		req.TimeoutMS = 1
	}
	if *interactive && stdin != nil {
		b, err := io.ReadAll(stdin)
		if err != nil {
			d.fail(err)
			return exitExecFailed
		}
		req.Stdin = b
		if req.Stdin == nil {
			req.Stdin = []byte{}
		}
	}
	id, err := d.resolve(rest[0])
	if err != nil {
		d.fail(err)
		return exitExecFailed
	}
	st, err := d.c.Exec(ctx, id, req, stdout, stderr)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "warren exec: interrupted; the process in the guest was killed")
		return exitInterrupted
	default:
		d.fail(err)
		var e *client.Error
		if errors.As(err, &e) && e.Status == 404 && strings.Contains(e.Message, "guest agent") {
			return exitNotFound
		}
		return exitExecFailed
	}
	if st.TimedOut {
		fmt.Fprintf(stderr, "warren exec: timed out after %v; the process was killed\n", *timeout)
		return exitTimedOut
	}
	return st.Exit
}

// sbTarget is one side of `warren cp`: SANDBOX:/path or a host path.
type sbTarget struct{ sandbox, path string }

func parseSbTarget(s string) sbTarget {
	if i := strings.Index(s, ":/"); i > 0 {
		return sbTarget{s[:i], s[i+1:]}
	}
	return sbTarget{path: s}
}

func sbCpCmd(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "cp", "cp SRC DST\n\nOne of SRC and DST is SANDBOX:/guest/path, the other a host path or - (stdin/stdout).", stdout, stderr)
	if code := d.parse(args); code != 0 {
		return code
	}
	if d.fs.NArg() != 2 {
		return d.usageErr()
	}
	src, dst := parseSbTarget(d.fs.Arg(0)), parseSbTarget(d.fs.Arg(1))
	if (src.sandbox == "") == (dst.sandbox == "") {
		return d.fail(fmt.Errorf("exactly one of %s and %s must be SANDBOX:/guest/path", d.fs.Arg(0), d.fs.Arg(1)))
	}
	var err error
	if dst.sandbox != "" {
		err = d.copyIn(src.path, dst, stdin)
	} else {
		err = d.copyOut(src, dst.path, stdout)
	}
	if err != nil {
		return d.fail(err)
	}
	return 0
}

// copyIn uploads a host file (or stdin for "-") with its permission bits;
// to a guest path ending in / it keeps the base name.
func (d *daemonCmd) copyIn(hostPath string, dst sbTarget, stdin io.Reader) error {
	id, err := d.resolve(dst.sandbox)
	if err != nil {
		return err
	}
	r, mode, done, err := openCopySource(hostPath, stdin)
	if err != nil {
		return err
	}
	defer done()
	if r == nil {
		r = strings.NewReader("")
	}
	p := dst.path
	if strings.HasSuffix(p, "/") && hostPath != "-" {
		p = path.Join(p, filepath.Base(hostPath))
	}
	_, err = d.c.WriteFile(d.ctx, id, p, r, mode)
	return err
}

// copyOut downloads a guest file to a host file (renamed into place when
// complete, with the guest file's permissions) or stdout for "-"; into a
// host directory it keeps the base name.
func (d *daemonCmd) copyOut(src sbTarget, hostPath string, stdout io.Writer) error {
	id, err := d.resolve(src.sandbox)
	if err != nil {
		return err
	}
	return writeHostCopy(hostPath, src.path, stdout, func(w io.Writer) (os.FileMode, error) {
		return d.c.ReadFile(d.ctx, id, src.path, w)
	})
}

// sandboxLine prints a sandbox's id and status, or its JSON.
func (d *daemonCmd) sandboxLine(s *client.Sandbox) {
	if *d.asJSON {
		d.printJSON(s)
		return
	}
	fmt.Fprintf(d.stdout, "%s %s\n", s.ID, s.Status)
}

func sbPauseCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "pause", "pause [--to-disk] SANDBOX", stdout, stderr)
	toDisk := d.fs.Bool("to-disk", false, "snapshot the sandbox and stop its VMM (status suspended; resume restores it)")
	id, code := d.parseSandbox(args, 1)
	if code != 0 {
		return code
	}
	fn, done := d.progress("pause")
	s, err := d.c.Pause(ctx, id, *toDisk, fn)
	done()
	if err != nil {
		return d.fail(err)
	}
	d.sandboxLine(s)
	return 0
}

func sbResumeCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "resume", "resume SANDBOX", stdout, stderr)
	id, code := d.parseSandbox(args, 1)
	if code != 0 {
		return code
	}
	fn, done := d.progress("resume")
	s, err := d.c.Resume(ctx, id, fn)
	done()
	if err != nil {
		return d.fail(err)
	}
	d.sandboxLine(s)
	return 0
}

func sbSnapshotCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "snapshot", "snapshot [--incremental] [--name NAME] SANDBOX\n       warren snapshot --every D [--keep N] SANDBOX   (rolling; --every 0 stops them)\n       warren snapshot --list SANDBOX", stdout, stderr)
	incremental := d.fs.Bool("incremental", false, "store only the pages written since the sandbox's previous snapshot")
	name := d.fs.String("name", "", "the snapshot's name (default snap-N)")
	every := d.fs.String("every", "", "take rolling snapshots at this interval, kept by the daemon (0: stop them)")
	keep := d.fs.Int("keep", 0, "with --every: layers in a chain before a new full snapshot (daemon default 8)")
	list := d.fs.Bool("list", false, "list the sandbox's snapshots")
	id, code := d.parseSandbox(args, 1)
	if code != 0 {
		return code
	}
	switch {
	case *list:
		snaps, rolling, err := d.c.Snapshots(ctx, id)
		if err != nil {
			return d.fail(err)
		}
		if *d.asJSON {
			d.printJSON(map[string]any{"snapshots": snaps, "rolling": rolling})
			return 0
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tKIND\tBYTES\tROLLING\tTIME")
		for _, s := range snaps {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%s\n", s.Name, s.Kind, s.Bytes, s.Rolling, s.Time.Local().Format(time.DateTime))
		}
		tw.Flush()
		if rolling != nil {
			fmt.Fprintf(stdout, "rolling: every %s, keep %d\n", rolling.Every, rolling.Keep)
		}
		return 0
	case *every != "":
		var dur time.Duration
		if *every != "0" && *every != "off" {
			var err error
			if dur, err = time.ParseDuration(*every); err != nil || dur <= 0 {
				fmt.Fprintf(stderr, "warren snapshot: --every %q is not a duration\n", *every)
				return 2
			}
		}
		r, err := d.c.SetRolling(ctx, id, dur, *keep)
		if err != nil {
			return d.fail(err)
		}
		switch {
		case *d.asJSON:
			d.printJSON(map[string]any{"rolling": r})
		case r == nil:
			fmt.Fprintf(stdout, "%s: rolling snapshots off\n", id)
		default:
			fmt.Fprintf(stdout, "%s: rolling snapshots every %s, keep %d\n", id, r.Every, r.Keep)
		}
		return 0
	}
	s, err := d.c.Snapshot(ctx, id, wire.SnapshotRequest{Name: *name, Incremental: *incremental})
	if err != nil {
		return d.fail(err)
	}
	if *d.asJSON {
		d.printJSON(s)
	} else {
		fmt.Fprintln(stdout, s.Name)
	}
	return 0
}

func sbForkCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "fork", "fork [-n N] SANDBOX", stdout, stderr)
	n := d.fs.Int("n", 1, "number of children (1-64)")
	id, code := d.parseSandbox(args, 1)
	if code != 0 {
		return code
	}
	if *n < 1 {
		return d.usageErr()
	}
	fn, done := d.progress("fork")
	r, err := d.c.Fork(ctx, id, *n, fn)
	done()
	if err != nil {
		return d.fail(err)
	}
	if *d.asJSON {
		d.printJSON(r)
	} else {
		for _, c := range r.Children {
			fmt.Fprintln(stdout, c.ID)
		}
		fmt.Fprintf(stderr, "warren fork: %d of %d children; parent paused %.1f ms\n", len(r.Children), *n, r.PauseMS)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(stderr, "warren fork: %s\n", e)
	}
	if len(r.Children) < *n {
		return 1
	}
	return 0
}

func sbRollbackCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "rollback", "rollback SANDBOX SNAPSHOT", stdout, stderr)
	id, code := d.parseSandbox(args, 2)
	if code != 0 {
		return code
	}
	rep, err := d.c.Rollback(ctx, id, d.fs.Arg(1))
	if err != nil {
		return d.fail(err)
	}
	if *d.asJSON {
		d.printJSON(rep)
	} else if line, ok := rep["line"].(string); ok && line != "" {
		fmt.Fprintln(stdout, line)
	} else {
		fmt.Fprintf(stdout, "%s rolled back to %s\n", id, d.fs.Arg(1))
	}
	return 0
}

// readPolicy reads an egress policy file (checked by the daemon; here
// only that it is JSON).
func readPolicy(path string) (json.RawMessage, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%s: not JSON", path)
	}
	return b, nil
}

// sbEgressCmd is `warren egress [--policy FILE] SANDBOX`, the daemon's
// spelling of the VM-level `warren egress [--policy FILE] API`.
func sbEgressCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := newDaemonCmd(ctx, "egress", "egress [--policy FILE] SANDBOX\n\nprints the egress policy in force and the counters of a network sandbox;\nwith --policy, replaces the policy first (live, and for its later restores)", stdout, stderr)
	pol := d.fs.String("policy", "", "replace the sandbox's egress policy with this one (JSON)")
	id, code := d.parseSandbox(args, 1)
	if code != 0 {
		return code
	}
	var rep *wire.EgressReply
	var err error
	if *pol != "" {
		b, rerr := readPolicy(*pol)
		if rerr != nil {
			return d.fail(rerr)
		}
		// (err, not a new one in this block: a refused policy must fail.)
		rep, err = d.c.SetEgress(ctx, id, b)
	} else {
		rep, err = d.c.Egress(ctx, id)
	}
	if err != nil {
		return d.fail(err)
	}
	d.printJSON(rep)
	return 0
}

// secretsCmd is `warren secrets [ls]`, `secrets set NAME [FILE|-]` and
// `secrets rm NAME...`. A value never comes from the command line (it
// would be in the process list and shell history).
func secretsCmd(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	sub, args := subcommand(args, "ls")
	switch sub {
	case "ls", "list":
		d := newDaemonCmd(ctx, "secrets", "secrets [ls]", stdout, stderr)
		if code := d.parseNone(args); code != 0 {
			return code
		}
		l, err := d.c.Secrets(ctx)
		if err != nil {
			return d.fail(err)
		}
		if *d.asJSON {
			d.printJSON(wire.SecretList{Names: l})
			return 0
		}
		for _, n := range l {
			fmt.Fprintln(stdout, n)
		}
		return 0
	case "set":
		d := newDaemonCmd(ctx, "secrets set", "secrets set NAME [FILE|-]\n\nThe value is FILE's bytes, or standard input's (- or no FILE); one trailing newline is dropped.", stdout, stderr)
		if code := d.parse(args); code != 0 {
			return code
		}
		if d.fs.NArg() < 1 || d.fs.NArg() > 2 {
			return d.usageErr()
		}
		var v []byte
		var err error
		if src := d.fs.Arg(1); src != "" && src != "-" {
			v, err = os.ReadFile(src)
		} else if stdin != nil {
			v, err = io.ReadAll(io.LimitReader(stdin, 1<<20))
		}
		if err != nil {
			return d.fail(err)
		}
		if t, ok := bytes.CutSuffix(v, []byte("\n")); ok {
			v = bytes.TrimSuffix(t, []byte("\r"))
		}
		if err := d.c.SetSecret(ctx, d.fs.Arg(0), bytes.NewReader(v)); err != nil {
			return d.fail(err)
		}
		fmt.Fprintln(stdout, d.fs.Arg(0))
		return 0
	case "rm", "delete":
		d := newDaemonCmd(ctx, "secrets rm", "secrets rm NAME...", stdout, stderr)
		return d.forEachArg(args, func(n string) (string, error) { return n, d.c.DeleteSecret(ctx, n) })
	}
	fmt.Fprintf(stderr, "warren secrets: unknown sub-command %q (ls, set, rm)\n", sub)
	return 2
}

// keysCmd is `warren keys [show]`, `keys create` and `keys revoke --yes`.
func keysCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sub, args := subcommand(args, "show")
	var d *daemonCmd
	var yes *bool
	switch sub {
	case "show", "create":
		d = newDaemonCmd(ctx, "keys "+sub, "keys "+sub, stdout, stderr)
	case "revoke":
		d = newDaemonCmd(ctx, "keys revoke", "keys revoke --yes\n\nRevoking crypto-shreds the tenant's key: its running sandboxes are stopped, and its\nsnapshots and disks can never be read again.", stdout, stderr)
		yes = d.fs.Bool("yes", false, "confirm: the tenant's snapshots and disks become unreadable for good")
	default:
		fmt.Fprintf(stderr, "warren keys: unknown sub-command %q (show, create, revoke)\n", sub)
		return 2
	}
	if code := d.parseNone(args); code != 0 {
		return code
	}
	var k wire.KeyInfo
	var err error
	switch sub {
	case "show":
		k, err = d.c.Key(ctx)
	case "create":
		k, err = d.c.CreateKey(ctx)
	case "revoke":
		if !*yes {
			fmt.Fprintln(stderr, "warren keys revoke: the tenant's snapshots and disks would become unreadable for good; add --yes")
			return 2
		}
		k, err = d.c.RevokeKey(ctx)
	}
	if err != nil {
		return d.fail(err)
	}
	if *d.asJSON {
		d.printJSON(k)
		return 0
	}
	switch {
	case k.Revoked && sub == "revoke":
		fmt.Fprintf(stdout, "revoked; sandboxes stopped: %d %s\n", len(k.Stopped), strings.Join(k.Stopped, " "))
	case k.Revoked:
		fmt.Fprintln(stdout, "revoked")
	default:
		fmt.Fprintln(stdout, k.KeyID)
	}
	return 0
}

// parseNone parses args for a verb that takes no operands.
func (d *daemonCmd) parseNone(args []string) int {
	if code := d.parse(args); code != 0 {
		return code
	}
	if d.fs.NArg() != 0 {
		return d.usageErr()
	}
	return 0
}

// subcommand splits a verb's sub-command (`templates ls`, `secrets set`)
// off args; def when args start with a flag or are empty.
func subcommand(args []string, def string) (string, []string) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0], args[1:]
	}
	return def, args
}
