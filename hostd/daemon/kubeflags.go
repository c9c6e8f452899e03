package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/warrenvm/warren/fleet/objstore"
	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/kube"
	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

// kubeFlags are warren-hostd's --kube* flags: joining a fleet (hostd/kube).
type kubeFlags struct {
	kubeconfig, host, endpoint, cpuGroup string
	memMiB, cpus                         int
	lease                                time.Duration
	// s3 is the fleet's object store (--kube-s3*, s3Flags).
	s3 s3Flags
	// fs is the daemon's flag set (its --keys: the tenants' keys the
	// object store encrypts with).
	fs *flag.FlagSet
}

func (k *kubeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.kubeconfig, "kube", "", "join a fleet: the kubeconfig FILE of its Kubernetes API server (this host registers as a WarrenHost, renews its Lease and runs the Sandboxes placed on it)")
	fs.StringVar(&k.host, "kube-host", "", "with --kube: this host's WarrenHost name (default the host name)")
	fs.StringVar(&k.endpoint, "kube-endpoint", "", "with --kube: the URL clients reach this daemon's API on (e.g. https://host:7443)")
	fs.IntVar(&k.memMiB, "kube-memory-mib", 0, "with --kube: memory offered to sandboxes in MiB (default MemTotal less 1 GiB)")
	fs.IntVar(&k.cpus, "kube-cpus", 0, "with --kube: CPUs offered to sandboxes (default all)")
	fs.StringVar(&k.cpuGroup, "kube-cpu-group", "", "with --kube: this host's CPU group (default: named after the CPU fingerprint snapshots carry; hosts of one group restore each other's snapshots)")
	fs.DurationVar(&k.lease, "kube-lease", 40*time.Second, "with --kube: how long this host's Lease lasts unrenewed (the controller marks its sandboxes Lost after)")
	k.s3.register(fs)
	k.fs = fs
}

// hostNameRE is what a WarrenHost name may be (a DNS label).
var hostNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// config returns the agent's configuration.
func (k *kubeFlags) config(socket, state string, log *slog.Logger) (kube.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", k.kubeconfig)
	if err != nil {
		return kube.Config{}, err
	}
	if k.host != "" && !hostNameRE.MatchString(k.host) {
		return kube.Config{}, fmt.Errorf("--kube-host %q: want a DNS label", k.host)
	}
	if k.lease < 4*time.Second {
		return kube.Config{}, errors.New("--kube-lease: at least 4s")
	}
	group := k.cpuGroup
	if group == "" {
		fp, err := vmsnap.HostFingerprint("/dev/kvm", hostprofile.Detect("/sys/module"))
		if err != nil {
			return kube.Config{}, fmt.Errorf("the CPU fingerprint (or set --kube-cpu-group): %w", err)
		}
		group = kube.CPUGroupOf(fp)
	}
	cfg := kube.Config{Kube: rc, Host: k.host, Endpoint: k.endpoint, Socket: socket, StateDir: state, CPUGroup: group,
		LeaseDuration: k.lease, Log: log}
	keys := ""
	if k.fs != nil {
		if f := k.fs.Lookup("keys"); f != nil {
			keys = f.Value.String()
		}
	}
	snaps, err := k.s3.store(state, keys)
	if err != nil {
		return kube.Config{}, err
	}
	if snaps != nil {
		cfg.Snapshots = snaps
	}
	cfg.Capacity.MemoryMiB, cfg.Capacity.CPUs = k.memMiB, k.cpus
	return cfg, nil
}

// s3Flags are warren-hostd's --kube-s3* flags: the fleet's object store,
// where suspended sandboxes' snapshots go (hostd/kube's ObjectSnapshots).
type s3Flags struct {
	endpoint, bucket, credentials, cache string
	insecure                             bool
}

func (s *s3Flags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.endpoint, "kube-s3", "", "with --kube: the fleet's S3-compatible object store, HOST:PORT (https; see --kube-s3-insecure): suspended sandboxes' snapshots go there and resume on any host; unset: they stay on this host")
	fs.StringVar(&s.bucket, "kube-s3-bucket", "warren-snapshots", "with --kube-s3: the bucket (made when missing)")
	fs.StringVar(&s.credentials, "kube-s3-credentials", "", `with --kube-s3: a JSON FILE (mode 0600 or stricter) {"access_key": ..., "secret_key": ..., "region": optional, "name_secret": optional, the same on every host: keys object names}`)
	fs.BoolVar(&s.insecure, "kube-s3-insecure", false, "with --kube-s3: plain http (only to a loopback address)")
	fs.StringVar(&s.cache, "kube-s3-cache", "", "with --kube-s3: where fetched objects are kept, still sealed (default: objcache/ in the state directory)")
}

// s3Credentials is --kube-s3-credentials' file.
type s3Credentials struct {
	AccessKey  string `json:"access_key"`
	SecretKey  string `json:"secret_key"`
	Region     string `json:"region,omitempty"`
	NameSecret string `json:"name_secret,omitempty"`
}

// readS3Credentials reads the credentials file: a regular file no one
// but its owner may read, at most 64 KiB.
func readS3Credentials(path string) (*s3Credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: want a regular file of mode 0600 or stricter", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 64<<10 {
		return nil, fmt.Errorf("%s: more than 64 KiB", path)
	}
	var c s3Credentials
	if err := strictjson.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if c.AccessKey == "" || c.SecretKey == "" {
		return nil, fmt.Errorf("%s: access_key and secret_key are required", path)
	}
	return &c, nil
}

// store connects to the object store (nil without --kube-s3). state is the
// daemon's state directory, keys its --keys directory ("": none).
func (s *s3Flags) store(state, keys string) (kube.SnapshotStore, error) {
	if s.endpoint == "" {
		return nil, nil
	}
	if s.credentials == "" {
		return nil, errors.New("--kube-s3 needs --kube-s3-credentials")
	}
	if s.insecure {
		host, _, err := net.SplitHostPort(s.endpoint)
		ip := net.ParseIP(host)
		if err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
			return nil, fmt.Errorf("--kube-s3-insecure: %s is not a loopback HOST:PORT", s.endpoint)
		}
	}
	c, err := readS3Credentials(s.credentials)
	if err != nil {
		return nil, fmt.Errorf("--kube-s3-credentials: %w", err)
	}
	cache := s.cache
	if cache == "" {
		cache = filepath.Join(state, "objcache")
	}
	cfg := objstore.Config{Endpoint: s.endpoint, Secure: !s.insecure, Bucket: s.bucket, Region: c.Region,
		AccessKey: c.AccessKey, SecretKey: c.SecretKey, NameSecret: []byte(c.NameSecret), CacheDir: cache}
	if keys != "" {
		cfg.Keys = &crypt.LocalProvider{Dir: keys}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := objstore.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("--kube-s3: %w", err)
	}
	return &kube.ObjectSnapshots{Store: st}, nil
}
