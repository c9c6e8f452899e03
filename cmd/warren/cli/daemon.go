package cli

// The table of the warren verbs that talk to warren-hostd
// (hostd/openapi.yaml; the verbs are in sandboxes.go and images.go), their
// driver, and the routing between them and the VM-level verbs of the same names: a
// verb whose target is a VM's socket path (an existing socket, or an
// argument that looks like a path) runs the VM-level code, as it always
// did; `warren vm VERB ...` always does.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
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
                            [--mem MiB] [--cpus N] [--cmdline S] [--network] [--balloon]; templates rm ID...
                            templates create --image REF|oci-layout:DIR[:TAG]|docker-archive:FILE
                            (or --rootfs DIR|FILE.tar) [--disk-mib N] [--insecure-registry]
                            [--start-cmd CMD | --start-image-cmd] [--ready-cmd CMD]: a root file
                            system from an image (local sources are uploaded)
  images                    the tenant's image bases (one per image digest); images rm KEY...
  create    [--template ID] [--mem MiB] [--cpus N] [--name NAME] [--env K=V]...
            [--egress POLICY.json] [--secret NAME]...                             prints the sandbox id
  ls                        list sandboxes
  exec      [--timeout D] [--cwd DIR] [--env K=V] [--user U] [-i] [-t] [-d] SANDBOX -- PROGRAM [ARGS...]
            -d: in the background, prints its id; -t: on a terminal (Ctrl-] detaches)
  ps        SANDBOX         the sandbox's processes (exec -d, -t, --user)
  logs      [-f] [--offset N] SANDBOX PID   a process's output (kept in the guest); -f follows it
  attach    [--from-start] SANDBOX PID      follow a process's output, forward stdin (Ctrl-] detaches)
  signal    SANDBOX PID SIGNAL              signal a process's group
  wait      SANDBOX PID     wait until a process exits; exit with its code
  files     ls [-d DEPTH] SANDBOX [PATH]; stat SANDBOX PATH; mkdir [-p] [-m MODE] SANDBOX PATH;
            rm [-r] SANDBOX PATH; mv SANDBOX FROM TO; watch [-r] [--count N] SANDBOX PATH
  cp        SRC DST         one side SANDBOX:/guest/path, the other a host path or -
  pause     [--to-disk] SANDBOX
  resume    SANDBOX
  snapshot  [--incremental] [--name N] SANDBOX; snapshot --every 60s [--keep N] SANDBOX;
            snapshot --every 0 SANDBOX (stop); snapshot --list SANDBOX
  fork      [-n N] SANDBOX  prints the children's ids
  rollback  SANDBOX SNAPSHOT
  rm        SANDBOX...
  egress    [--policy FILE] SANDBOX   a network sandbox's egress policy and counters; --policy replaces it
  balloon   [--target MiB] [--stats-interval S] SANDBOX   a --balloon sandbox's memory balloon: target,
                            actual, free page reporting, the guest's memory statistics, counters;
                            --target sets how much of the guest's memory it takes
  secrets                   list the tenant's secrets (names); secrets set NAME [FILE|-] (value from
                            FILE or stdin, one trailing newline dropped); secrets rm NAME...
  keys                      the tenant's encryption key (warren-hostd --keys): its ID, or "revoked";
                            keys create (seals the tenant's snapshots and idle disks under a new key);
                            keys revoke --yes (crypto-shreds it: stops the tenant's sandboxes, and its
                            snapshots and disks can no longer be read)
  store     stats [--state DIR [--keys DIR]]   the page store: snapshot layers' logical vs stored bytes
  events                    stream lifecycle events
  mcp       [--http [HOST]:PORT [--http-token T]]   an MCP server of the sandbox tools, for LLM clients
                            (stdio; or HTTP with a bearer token, --http-token or $WARREN_MCP_TOKEN)

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

// boolFlags are the flags, of either spelling of every verb, that take no
// value (to find the verbs' positional arguments before parsing).
var boolFlags = map[string]bool{"i": true, "json": true, "netns": true, "incremental": true, "to-disk": true,
	"list": true, "h": true, "help": true, "lazy": true, "network": true, "balloon": true, "d": true, "t": true}

// isDaemonVerb reports whether verb is one of the daemon's (of its own,
// or shared with the VM level).
func isDaemonVerb(verb string) bool {
	_, ok := daemonVerbs[verb]
	return ok || subcommands[verb] != nil
}

// daemonMain runs the daemon verbs and routes the shared ones; ok is
// false when args are the VM-level command's.
func (a *app) daemonMain(args []string) (code int, ok bool) {
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
		if len(args) == 0 || !isDaemonVerb(args[0]) {
			fmt.Fprintf(a.stderr, "warren: %s must come before a sandbox command\n%s", strings.Join(global, " "), daemonUsage)
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
			fmt.Fprint(a.stderr, usage)
			return 2, true
		}
		return a.vmMain(rest), true
	case "help", "-h", "--help":
		fmt.Fprint(a.stdout, daemonUsage+usage)
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
		if !isDaemonVerb(verb) {
			return 0, false
		}
	}
	if vmLevel {
		return 0, false
	}
	if a.routeOnly {
		return 0, true
	}
	return a.runDaemon(verb, rest), true
}

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

// A daemonVerb is one row of daemonVerbs: its usage (after "usage:
// warren "), the operands it takes (min to max; max -1: no limit),
// whether the first is a sandbox (resolved into d.id before it runs), and
// setup, which defines its flags on d.fs and returns what runs it once
// they are parsed and d is connected.
type daemonVerb struct {
	usage    string
	min, max int
	sandbox  bool
	setup    func(d *daemonCmd) func() int
}

// onSandbox is a daemonVerb's operands: n, the first a sandbox.
func onSandbox(usage string, n int, setup func(d *daemonCmd) func() int) daemonVerb {
	return daemonVerb{usage: usage, min: n, max: n, sandbox: true, setup: setup}
}

// daemonVerbs are the verbs that talk to warren-hostd, by name: a
// sub-command's is its verb's and its own ("templates create"), except a
// listing's ("templates" for templates ls).
var daemonVerbs = map[string]daemonVerb{
	"templates":        {usage: "templates [ls]", setup: listTemplates},
	"templates create": {usage: templatesCreateUsage, setup: templatesCreate},
	"templates rm":     {usage: "templates rm ID...", min: 1, max: -1, setup: deleteEach((*client.Client).DeleteTemplate)},
	"images":           {usage: "images [ls]", setup: listImages},
	"images rm":        {usage: "images rm KEY...", min: 1, max: -1, setup: deleteEach((*client.Client).DeleteImage)},
	"secrets":          {usage: "secrets [ls]", setup: listSecrets},
	"secrets set":      {usage: "secrets set NAME [FILE|-]\n\nThe value is FILE's bytes, or standard input's (- or no FILE); one trailing newline is dropped.", min: 1, max: 2, setup: setSecret},
	"secrets rm":       {usage: "secrets rm NAME...", min: 1, max: -1, setup: deleteEach((*client.Client).DeleteSecret)},
	"keys show":        {usage: "keys show", setup: showKey("show", (*client.Client).Key)},
	"keys create":      {usage: "keys create", setup: showKey("create", (*client.Client).CreateKey)},
	"keys revoke":      {usage: keysRevokeUsage, setup: revokeKey},
	"create":           {usage: "create [--template ID] [--mem MiB] [--cpus N] [--name NAME] [--env K=V]... [--label K=V]... [--egress FILE] [--secret NAME]...", setup: createCmd},
	"ls":               {usage: "ls", setup: lsCmd},
	"rm":               {usage: "rm SANDBOX...", min: 1, max: -1, setup: rmCmd},
	"events":           {usage: "events", setup: eventsCmd},
	"mcp":              {usage: mcpUsage, setup: mcpCmd},
	"exec":             {usage: "exec [--timeout D] [--cwd DIR] [--env K=V]... [--user U] [-i] [-t] [-d] SANDBOX -- PROGRAM [ARGS...]", max: -1, setup: sbExecCmd},
	"ps":               onSandbox("ps SANDBOX\n\nlists the sandbox's processes (started with warren exec -d, -t or --user)", 1, psCmd),
	"logs":             onSandbox("logs [-f] [--offset N] SANDBOX PID\n\nprints the process's output kept in the guest (the last MiB); -f follows it until it exits", 2, logsCmd),
	"attach":           onSandbox(attachUsage, 2, attachCmd),
	"signal":           onSandbox("signal SANDBOX PID SIGNAL\n\nsends SIGNAL (TERM, SIGKILL, 9, ...) to the process's group", 3, signalCmd),
	"wait":             onSandbox("wait SANDBOX PID\n\nwaits until the process has exited, and exits with its code", 2, waitCmd),
	"files":            {usage: "files [ls] [-d DEPTH] SANDBOX [PATH]", min: 1, max: 2, sandbox: true, setup: filesLsCmd},
	"files stat":       onSandbox("files stat SANDBOX PATH", 2, filesStatCmd),
	"files mkdir":      onSandbox("files mkdir [-p] [-m MODE] SANDBOX PATH", 2, filesMkdirCmd),
	"files rm":         onSandbox("files rm [-r] SANDBOX PATH", 2, filesRmCmd),
	"files mv":         onSandbox("files mv SANDBOX FROM TO", 3, filesMvCmd),
	"files watch":      onSandbox("files watch [-r] [--count N] SANDBOX PATH\n\nprints a line per change under the guest directory PATH (TIME OP PATH) until interrupted", 2, filesWatchCmd),
	"cp":               {usage: "cp SRC DST\n\nOne of SRC and DST is SANDBOX:/guest/path, the other a host path or - (stdin/stdout).", min: 2, max: 2, setup: sbCpCmd},
	"pause":            onSandbox("pause [--to-disk] SANDBOX", 1, sbPauseCmd),
	"resume":           onSandbox("resume SANDBOX", 1, sbResumeCmd),
	"snapshot":         onSandbox(sbSnapshotUsage, 1, sbSnapshotCmd),
	"fork":             onSandbox("fork [-n N] SANDBOX", 1, sbForkCmd),
	"rollback":         onSandbox("rollback SANDBOX SNAPSHOT", 2, sbRollbackCmd),
	"egress": onSandbox("egress [--policy FILE] SANDBOX\n\nprints the egress policy in force and the counters of a network sandbox;\n"+
		"with --policy, replaces the policy first (live, and for its later restores)", 1, sbEgressCmd),
	"balloon": onSandbox(sbBalloonUsage, 1, sbBalloonCmd),
}

// subcommands are the daemon verbs made of sub-commands, with theirs (the
// first the default).
var subcommands = map[string][]string{
	"templates": {"ls", "create", "rm"},
	"images":    {"ls", "rm"},
	"secrets":   {"ls", "set", "rm"},
	"keys":      {"show", "create", "revoke"},
	"files":     {"ls", "stat", "mkdir", "rm", "mv", "watch"},
}

const attachUsage = "attach [--from-start] [--no-stdin] SANDBOX PID\n\n" +
	"follows the process's output from now on (--from-start: from the oldest byte kept) and forwards\n" +
	"standard input when it takes it; on a terminal (warren exec -t) the local one goes raw.\n" +
	"Ctrl-] (on a terminal) or an interrupt detaches; the process runs on. The exit code is the process's."

// runDaemon runs verb (with its sub-command, if it has them) with args.
func (a *app) runDaemon(verb string, args []string) int {
	name := verb
	if subs := subcommands[verb]; subs != nil {
		sub := subs[0]
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			sub, args = args[0], args[1:]
		}
		key := map[string]string{"list": "ls", "delete": "rm"}[sub]
		if key == "" {
			key = sub
		}
		if !slices.Contains(subs, key) {
			fmt.Fprintf(a.stderr, "warren %s: unknown sub-command %q (%s)\n", verb, sub, strings.Join(subs, ", "))
			return 2
		}
		if key != "ls" {
			name += " " + key
		}
	}
	v := daemonVerbs[name]
	ctx, stop := interruptContext()
	defer stop()
	d := a.newDaemonCmd(ctx, name, v.usage)
	run := v.setup(d)
	if code := d.parse(args); code != 0 {
		return code
	}
	if n := d.fs.NArg(); n < v.min || v.max >= 0 && n > v.max {
		return d.usageErr()
	}
	if v.sandbox {
		id, err := d.c.Resolve(ctx, d.fs.Arg(0))
		if err != nil {
			return d.fail(err)
		}
		d.id = id
	}
	return run()
}

// daemonCmd is what every daemon verb shares: flags, the client, output.
type daemonCmd struct {
	name           string
	fs             *flag.FlagSet
	cfg            client.Config // the daemon flags' values (defaults: client.EnvConfig)
	asJSON         *bool
	stdin          io.Reader
	stdout, stderr io.Writer
	c              *client.Client
	ctx            context.Context
	id             string // the sandbox operand's id (daemonVerb.sandbox)
	done           func() // ends the progress display (progress)
}

func (a *app) newDaemonCmd(ctx context.Context, verb, usageLine string) *daemonCmd {
	d := &daemonCmd{name: "warren " + verb, stdin: a.stdin, stdout: a.stdout, stderr: a.stderr, ctx: ctx}
	d.fs = flag.NewFlagSet(d.name, flag.ContinueOnError)
	d.fs.SetOutput(d.stderr)
	d.fs.Usage = func() {
		fmt.Fprintf(d.stderr, "usage: warren %s\n\n", usageLine)
		d.fs.PrintDefaults()
	}
	env := client.EnvConfig()
	d.fs.StringVar(&d.cfg.Host, "host", env.Host, "the daemon: a unix socket path, or https://HOST:PORT or http://HOST:PORT (token in $WARREN_TOKEN) ($WARREN_HOST)")
	d.fs.StringVar(&d.cfg.TLS.CAFile, "ca-file", env.TLS.CAFile, "https daemon: PEM roots its certificate must chain to, instead of the system's ($WARREN_CA)")
	d.fs.StringVar(&d.cfg.TLS.CertFile, "client-cert", env.TLS.CertFile, "https daemon with mutual TLS: this client's PEM certificate ($WARREN_CLIENT_CERT)")
	d.fs.StringVar(&d.cfg.TLS.KeyFile, "client-key", env.TLS.KeyFile, "the PEM key of --client-cert ($WARREN_CLIENT_KEY)")
	d.fs.StringVar(&d.cfg.Tenant, "tenant", env.Tenant, "the tenant to act as ($WARREN_TENANT; default \"default\" on the unix socket)")
	d.cfg.Token = env.Token
	d.asJSON = d.fs.Bool("json", false, "print the daemon's full JSON answers")
	return d
}

// parse parses args and connects; code is non-zero on a usage error.
func (d *daemonCmd) parse(args []string) (code int) {
	if err := d.fs.Parse(args); err != nil {
		return 2
	}
	// $WARREN_CA and friends only apply to https daemons; the flags,
	// given for another, are an error (client.Config.Connect).
	explicitTLS := false
	d.fs.Visit(func(f *flag.Flag) {
		explicitTLS = explicitTLS || f.Name == "ca-file" || f.Name == "client-cert" || f.Name == "client-key"
	})
	c, err := d.cfg.Connect(explicitTLS)
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

// show ends the progress display and reports err (exit 1), or prints v:
// its JSON with --json, else text(v).
func show[T any](d *daemonCmd, v T, err error, text func(T)) int {
	if d.done != nil {
		d.done()
	}
	if err != nil {
		return d.fail(err)
	}
	if *d.asJSON {
		printJSON(d.stdout, v)
	} else {
		text(v)
	}
	return 0
}

// progress returns the display of a long operation's steps on stderr: on
// a terminal one line rewritten in place, otherwise one line a step; show
// ends it.
func (d *daemonCmd) progress(what string) client.ProgressFunc {
	tty := isTerminal(d.stderr)
	shown := false
	d.done = func() {
		if shown {
			fmt.Fprint(d.stderr, "\r\033[K")
		}
	}
	return func(p wire.Progress) {
		if tty {
			fmt.Fprintf(d.stderr, "\r\033[K%s: %s %3d%%", what, p.Step, p.Pct)
			shown = true
			return
		}
		fmt.Fprintf(d.stderr, "%s: [%3d%%] %s\n", what, p.Pct, p.Step)
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

// each is the setup of a verb that runs do on each operand in turn: what
// it returns is printed, an error reported (the others still run; the
// exit code is then 1). For the verbs that delete by name.
func each(do func(c *client.Client, ctx context.Context, arg string) (string, error)) func(d *daemonCmd) func() int {
	return func(d *daemonCmd) func() int {
		return func() int {
			code := 0
			for _, a := range d.fs.Args() {
				out, err := do(d.c, d.ctx, a)
				if err != nil {
					code = d.fail(err)
					continue
				}
				fmt.Fprintln(d.stdout, out)
			}
			return code
		}
	}
}

// deleteEach is each for a delete by name (del) that prints the name.
func deleteEach(del func(*client.Client, context.Context, string) error) func(d *daemonCmd) func() int {
	return each(func(c *client.Client, ctx context.Context, name string) (string, error) {
		return name, del(c, ctx, name)
	})
}

// listing is the setup of a verb that lists what list fetches: as JSON
// with --json, else a table of header and one row per item.
func listing[T any](list func(*client.Client, context.Context) ([]T, error), header string, row func(T) string) func(d *daemonCmd) func() int {
	return func(d *daemonCmd) func() int {
		return func() int {
			l, err := list(d.c, d.ctx)
			return show(d, l, err, func(l []T) {
				tw := tabwriter.NewWriter(d.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, header)
				for _, x := range l {
					fmt.Fprintln(tw, row(x))
				}
				tw.Flush()
			})
		}
	}
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
