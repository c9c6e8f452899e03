package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/kube"
	"github.com/warrenvm/warren/hostd/metrics"
)

// Main is warren-hostd's main: it parses args, starts the daemon and
// serves until SIGINT or SIGTERM, and returns the exit code. On a signal
// the VMMs keep running (a new daemon re-adopts them); with
// --stop-on-exit they are stopped, with --suspend-on-exit paused to disk.
func Main(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren-hostd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// The options the daemon takes as given go straight into its Config.
	var cfg Config
	fs.StringVar(&cfg.State, "state", "/var/lib/warren", "state directory (records, snapshots, sockets)")
	sock := fs.String("socket", "/run/warren/hostd.sock", "the API's unix socket (tenant from the X-Warren-Tenant header, for uids --tenant-uid allows)")
	var tenantUIDs stringList
	fs.Var(&tenantUIDs, "tenant-uid", "UID=tenant[,tenant...] (repeatable): on the unix socket, processes of local user UID (SO_PEERCRED) act for these tenants (* for any); root and this daemon's uid act for any, every other uid is refused (403)")
	warren := fs.String("warren", "", "the binary the VMMs run: warren-vmm, or warren (default: warren-vmm beside this executable, else warren beside it, else either in PATH)")
	listen := fs.String("listen", "", "also serve the API on this TCP address (needs --tokens)")
	tokens := fs.String("tokens", "", "JSON file {\"token\": \"tenant\"} (mode 0600) for --listen")
	tlsCert := fs.String("tls-cert", "", "--listen serves HTTPS with this PEM certificate (chain) of the operator's")
	tlsKey := fs.String("tls-key", "", "the PEM private key of --tls-cert")
	clientCA := fs.String("client-ca", "", "with --tls-cert: mutual TLS; clients must present a certificate that chains to these PEM roots")
	insecureTCP := fs.Bool("insecure-tcp", false, "allow --listen on a non-loopback address without TLS (bearer tokens in cleartext)")
	audit := fs.String("audit", "", "API audit log, JSON lines (default STATE/audit.jsonl; - for stderr)")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup mount root; \"none\" to run VMMs without cgroups")
	verbose := fs.Bool("v", false, "debug logging")
	stopOnExit := fs.Bool("stop-on-exit", false, "stop every VMM when the daemon exits on a signal")
	suspendOnExit := fs.Bool("suspend-on-exit", false, "pause every sandbox to disk when the daemon exits on a signal")
	keys := fs.String("keys", "", "at-rest encryption: tenants' keys in DIR (crypt.LocalProvider; POST /v1/keys makes one); unset: no encryption")
	decryptDir := fs.String("decrypt-dir", "", "with --keys: where restores decrypt snapshots while the VMM loads them, and where the VMMs of network sandboxes of tenants with a key read their secrets (default: decrypted/ beside --socket, a tmpfs under /run)")
	uidRange := fs.String("vmm-uid-range", DefaultUIDRange, "FIRST:COUNT: every VMM without a network (sandboxes, their fork children, template builds) gets its own uid/gid from this range, none of them a user or group of the host, and pivot_roots into a jail holding only its files; off: VMMs stay root (so does --jail off)")
	fs.StringVar(&cfg.Jail, "jail", "vmm", "harden every VMM after its setup (vmmproc/jail): vmm, strict (forks then fail) or off; ,log logs what the seccomp filter lacks instead of refusing it")
	fs.StringVar(&cfg.EgressHosts, "egress-hosts", "", "network templates: an /etc/hosts-style file of fixed addresses for the sandboxes' resolvers and credential proxies (warren run --hosts)")
	fs.StringVar(&cfg.DNSUpstream, "dns-upstream", "", "network templates: the DNS server IP:PORT the sandboxes' resolvers ask allowed names of (warren run --dns-upstream; default the host's /etc/resolv.conf)")
	fs.StringVar(&cfg.EgressUpstreamAllow, "egress-upstream-allow", "", "network templates: comma-separated addresses or CIDRs the credential proxies may connect to although loopback, private, link-local or the host's own (warren run --upstream-allow; default none)")
	fs.BoolVar(&cfg.WildcardCredentials, "allow-wildcard-credentials", false, "allow credential hosts such as *.example.com in tenants' egress policies (the secret then goes to any name below)")
	fs.StringVar(&cfg.UpstreamCA, "upstream-ca", "", "network templates: PEM roots the credential proxies trust upstream instead of the system's (warren run --upstream-ca)")
	guestDir := fs.String("guest-dir", "", "the guest directory: the kernels, initramfs and raw disk images templates name (by name, never a path; owned by root or this user, writable by no one else); unset: templates from images only")
	fs.StringVar(&cfg.GuestKernel, "guest-kernel", "", "the guest kernel of templates made from images (--image) that name none: a name in --guest-dir, or a path")
	fs.StringVar(&cfg.GuestInitramfs, "guest-initramfs", "", "the guest initramfs of templates made from images that name none: a name in --guest-dir, or a path")
	fs.IntVar(&cfg.ImageDiskMiB, "image-disk-mib", 0, "default size of an image template's root file system in MiB (sparse; default 4096)")
	fs.Int64Var(&cfg.MaxImageBytes, "max-image-bytes", 0, "most uncompressed bytes an image's layers may hold (default: package image's, 16 GiB)")
	fs.Var((*stringList)(&cfg.Registries), "registry", "a registry HOST[:PORT] that may be pulled from at a loopback or private address and over plain HTTP (repeatable; e.g. a registry on 127.0.0.1)")
	fs.StringVar(&cfg.RestoreMemory, "restore-memory", RestoreMmap, "how creates restore their template's memory: mmap (the snapshot flattened once and mapped copy-on-write) or uffd (filled by userfaultfd as the guest touches it, mmap where the host cannot; the template's first create records the pages its guest touches until it runs a first command, beside the template's snapshot, and later creates prefetch them); resumes from disk keep theirs")
	fs.DurationVar(&cfg.TemplateCacheIdle, "template-cache-idle", time.Hour, "how long a template (of a tenant without a key) keeps its memory layer and flattened image after its last create; both are caches of the page store, rebuilt by its next create (0: kept for ever)")
	fs.IntVar(&cfg.MaxRestores, "max-restores", 0, "how many VMMs may restore at once (from start until the guest's agent answers); more creates and resumes queue (default: the host's CPUs)")
	var kc kubeFlags
	kc.register(fs)
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics (GET /metrics) on this TCP address, e.g. 127.0.0.1:9464 (default: off)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.TemplateCacheIdle == 0 {
		cfg.TemplateCacheIdle = -1 // kept for ever (Config's 0 is the default)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	fail := func(err error) int {
		log.Error("warren-hostd", "err", err)
		return 1
	}
	bin, err := findWarren(*warren)
	if err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(cfg.State, 0o700); err != nil {
		return fail(err)
	}
	var auditW io.Writer = stderr
	if *audit != "-" {
		p := *audit
		if p == "" {
			p = filepath.Join(cfg.State, "audit.jsonl")
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		auditW = f
	}
	var tokMap map[string]string
	if *listen != "" {
		if *tokens == "" {
			return fail(errors.New("--listen needs --tokens"))
		}
		if tokMap, err = LoadTokens(*tokens); err != nil {
			return fail(err)
		}
	}
	var tlsCfg *tls.Config
	switch {
	case *tlsCert != "" || *tlsKey != "":
		if tlsCfg, err = ServerTLS(*tlsCert, *tlsKey, *clientCA); err != nil {
			return fail(err)
		}
	case *clientCA != "":
		return fail(errors.New("--client-ca needs --tls-cert and --tls-key"))
	case *listen != "":
		if err := CheckPlainTCP(*listen, *insecureTCP); err != nil {
			return fail(fmt.Errorf("--listen: %w", err))
		}
	}
	uids := TenantUIDs{}
	for _, v := range tenantUIDs {
		if err := uids.ParseTenantUID(v); err != nil {
			return fail(fmt.Errorf("--tenant-uid: %w", err))
		}
	}
	vmmUIDs, err := ParseUIDRange(*uidRange)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if vmmUIDs != nil && cfg.Jail == "off" {
		if uidRangeSet(fs) {
			return fail(errors.New("--vmm-uid-range needs a jail (--jail vmm or strict)"))
		}
		log.Warn("--jail off: VMMs run as root, unconfined")
		vmmUIDs = nil
	}
	if vmmUIDs != nil {
		if err := vmmUIDs.CheckUnused("/etc/passwd", "/etc/group"); err != nil {
			return fail(err)
		}
	}
	cfg.VMMUIDs, cfg.Warren, cfg.Log, cfg.Audit = vmmUIDs, bin, log, auditW
	if _, err := checkRestoreMemory(cfg.RestoreMemory); err != nil {
		return fail(fmt.Errorf("--restore-memory %q: want %s or %s", cfg.RestoreMemory, RestoreMmap, RestoreUffd))
	}
	if cfg.ImageDiskMiB != 0 && (cfg.ImageDiskMiB < 64 || cfg.ImageDiskMiB > maxImageDiskMiB) {
		return fail(fmt.Errorf("--image-disk-mib: want 64 to %d", maxImageDiskMiB))
	}
	if cfg.DNSUpstream != "" {
		if _, err := netip.ParseAddrPort(cfg.DNSUpstream); err != nil {
			return fail(fmt.Errorf("--dns-upstream: %w", err))
		}
	}
	if *guestDir != "" {
		p, err := filepath.Abs(*guestDir)
		if err == nil {
			err = CheckGuestDir(p)
		}
		if err != nil {
			return fail(fmt.Errorf("--guest-dir: %w", err))
		}
		cfg.GuestDir = p
	}
	if _, err := policy.ParsePrefixes(cfg.EgressUpstreamAllow); err != nil {
		return fail(fmt.Errorf("--egress-upstream-allow: %w", err))
	}
	for _, f := range []struct {
		flag string
		val  *string
	}{{"--egress-hosts", &cfg.EgressHosts}, {"--upstream-ca", &cfg.UpstreamCA},
		{"--guest-kernel", &cfg.GuestKernel}, {"--guest-initramfs", &cfg.GuestInitramfs}} {
		if *f.val == "" {
			continue
		}
		if strings.HasPrefix(f.flag, "--guest-") && !strings.ContainsRune(*f.val, '/') {
			// A name in the guest directory, checked now.
			fl, err := openGuestFile(cfg.GuestDir, strings.TrimPrefix(f.flag, "--guest-"), *f.val)
			if err != nil {
				return fail(fmt.Errorf("%s: %w", f.flag, err))
			}
			fl.Close()
			continue
		}
		// The VMMs read it: an absolute path, checked now.
		p, err := filepath.Abs(*f.val)
		if err == nil {
			_, err = os.Stat(p)
		}
		if err != nil {
			return fail(fmt.Errorf("%s: %w", f.flag, err))
		}
		*f.val = p
	}
	if *keys != "" {
		if err := os.MkdirAll(*keys, 0o700); err != nil {
			return fail(err)
		}
		cfg.Keys = &crypt.LocalProvider{Dir: *keys}
		cfg.DecryptDir = *decryptDir
		if cfg.DecryptDir == "" {
			cfg.DecryptDir = filepath.Join(filepath.Dir(*sock), "decrypted")
		}
	}
	var d *Daemon
	mx := metrics.New(metrics.Sources{LiveSandboxes: func() map[string]int { return d.StatusCounts() }, EgressDenied: d.EgressDenied,
		Restores: d.Restores})
	cfg.Observer = mx
	d, err = New(cfg)
	if err != nil {
		return fail(err)
	}
	os.MkdirAll(filepath.Dir(*sock), 0o755)
	if c, err := net.Dial("unix", *sock); err == nil {
		c.Close()
		return fail(fmt.Errorf("%s: another daemon serves there", *sock))
	}
	os.Remove(*sock)
	ul, err := net.Listen("unix", *sock)
	if err != nil {
		return fail(err)
	}
	os.Chmod(*sock, 0o660)
	errc := make(chan error, 4)
	go func() { errc <- d.Serve(ul, PeerAuth(uids)) }()
	if *listen != "" {
		tl, err := net.Listen("tcp", *listen)
		if err != nil {
			return fail(err)
		}
		if tlsCfg != nil {
			tl = tls.NewListener(tl, tlsCfg)
		}
		go func() { errc <- d.Serve(tl, TokenAuth(tokMap)) }()
	}
	if *metricsAddr != "" {
		ml, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fail(err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", mx.Handler())
		go func() { errc <- (&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ml) }()
	}
	if kc.kubeconfig != "" {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		kcfg, err := kc.config(*sock, cfg.State, log)
		if err != nil {
			return fail(fmt.Errorf("--kube: %w", err))
		}
		go func() {
			if err := kube.Run(ctx, kcfg); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("kube: %w", err)
			}
		}()
	}
	log.Info("warren-hostd serving", "socket", *sock, "tcp", *listen, "tls", tlsCfg != nil, "mtls", *clientCA != "", "state", cfg.State, "warren", bin)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-sig:
		log.Info("signal: exiting", "signal", s.String())
	case err := <-errc:
		log.Error("serve", "err", err)
	}
	if *suspendOnExit || *stopOnExit {
		d.StopAll(*suspendOnExit)
	}
	d.Close()
	os.Remove(*sock)
	return 0
}

// findWarren resolves the binary the VMMs run: the flag; else warren-vmm
// (the VMM verbs alone: a smaller VMM process), then warren, beside this
// executable; else the same two in PATH.
func findWarren(flagVal string) (string, error) {
	if flagVal != "" {
		return filepath.Abs(flagVal)
	}
	exeDir := ""
	if exe, err := os.Executable(); err == nil {
		exeDir = filepath.Dir(exe)
	}
	return findWarrenIn(exeDir, exec.LookPath)
}

// findWarrenIn is findWarren's search: in dir ("" for none), then by
// lookPath.
func findWarrenIn(dir string, lookPath func(string) (string, error)) (string, error) {
	names := []string{"warren-vmm", "warren"}
	for _, n := range names {
		p := filepath.Join(dir, n)
		if fi, err := os.Stat(p); dir != "" && err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	for _, n := range names {
		if p, err := lookPath(n); err == nil {
			return filepath.Abs(p)
		}
	}
	return "", fmt.Errorf("no warren-vmm or warren binary: use --warren")
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

// Set appends v.
func (l *stringList) Set(v string) error {
	if v == "" {
		return errors.New("empty value")
	}
	*l = append(*l, v)
	return nil
}

// uidRangeSet says whether --vmm-uid-range was given on the command line.
func uidRangeSet(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "vmm-uid-range" })
	return set
}
