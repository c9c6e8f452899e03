package fleettest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// s3ReadyTimeout bounds how long SeaweedFS may take to take its first
// write (master, volume server, filer and gateway start one after
// another): 11 s on a 2-core machine, 28 s in the nested KVM host.
const s3ReadyTimeout = 3 * time.Minute

// S3 is a running S3-compatible object store (SeaweedFS: `weed server`
// with its master, one volume server, a filer and the S3 gateway, all in
// one process), stopped when the test that started it ends. It speaks
// plain HTTP with AWS Signature V4 and knows one identity, allowed
// everything.
type S3 struct {
	// Endpoint is host:port (plain HTTP), as minio.New takes it.
	Endpoint string
	// AccessKey and SecretKey are the identity's credentials, made by
	// StartS3.
	AccessKey, SecretKey string
	// Region is the region clients sign for.
	Region string
	// Dir holds the store's data, its identity file and its log (weed.log).
	Dir string
	// TLSEndpoint is host:port of the same API over HTTPS, and CAFile the
	// PEM file of the CA its certificate (for the store's address) chains
	// to: set when S3Options.TLS asked for them, else empty.
	TLSEndpoint, CAFile string
}

// S3Options are StartS3With's choices; the zero value is StartS3's.
type S3Options struct {
	// Addr is the address every port of the store listens on (the zero
	// Addr: 127.0.0.1). A test whose clients run in network namespaces
	// of its own gives an address of its side of their links.
	Addr netip.Addr
	// TLS also serves the S3 API over HTTPS (S3.TLSEndpoint) with a
	// certificate for Addr (ServingCert): warren-hostd takes plain HTTP
	// only from a loopback address.
	TLS bool
}

// StartS3 starts SeaweedFS on loopback ports with its data in a temporary
// directory of the test and returns once its S3 gateway has written, read
// back and removed an object (writeProbe): the store then holds no
// bucket. Tools' rules apply: without the binaries the test skips
// (fails under make test: internal/product).
func StartS3(t testing.TB) *S3 {
	t.Helper()
	return StartS3With(t, S3Options{})
}

// StartS3With is StartS3 with opts.
func StartS3With(t testing.TB, opts S3Options) *S3 {
	t.Helper()
	addr := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	if opts.Addr.IsValid() {
		addr = opts.Addr
	}
	tools := Tools(t)
	dir := t.TempDir()
	s := &S3{Dir: dir, AccessKey: "FT" + randHex(t, 9), SecretKey: randHex(t, 20), Region: "us-east-1"}
	ident := map[string]any{"identities": []any{map[string]any{
		"name":        "fleettest",
		"credentials": []any{map[string]string{"accessKey": s.AccessKey, "secretKey": s.SecretKey}},
		"actions":     []string{"Admin", "Read", "List", "Tagging", "Write"},
	}}}
	js, err := json.Marshal(ident)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "s3.json"), js, 0o600); err != nil {
		t.Fatal(err)
	}
	// Unix sockets need a short path (108 bytes); the test's directory
	// may be longer.
	sock, err := os.MkdirTemp("", "fleettest-s3-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s3ReadyTimeout)
	defer cancel()
	var tlsArgs []string
	if opts.TLS {
		c := ServingCert(t, dir, addr)
		s.CAFile = c.CA
		tlsArgs = []string{"-s3.cert.file=" + c.Cert, "-s3.key.file=" + c.Key}
	}
	err = withPorts(9, func(p []int) error {
		port := func(i int) string { return strconv.Itoa(p[i]) }
		s.Endpoint = net.JoinHostPort(addr.String(), port(6))
		args := tlsArgs
		if opts.TLS {
			s.TLSEndpoint = net.JoinHostPort(addr.String(), port(8))
			args = append(args, "-s3.port.https="+port(8))
		}
		// weed also makes a Unix socket per gRPC port at a path of its
		// own in /tmp; remove them once it is killed (this cleanup runs
		// after startServer's).
		t.Cleanup(func() {
			for i, svc := range []string{"master", "volume", "filer", "s3"} {
				removeDeadSocket(fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", svc, p[2*i+1]))
			}
		})
		// SIGKILL at once: weed takes more than 10 s to stop on SIGTERM,
		// and its data dies with the test.
		srv, err := startServer(t, "weed", dir, filepath.Join(dir, "weed.log"), 0, filepath.Join(tools, "weed"),
			append([]string{"server", "-ip=" + addr.String(), "-ip.bind=" + addr.String(), "-dir=" + data,
				"-master.port=" + port(0), "-master.port.grpc=" + port(1),
				// Never report to telemetry.seaweedfs.com.
				"-master.telemetry=false",
				// Small volumes, many of them: every bucket is a collection
				// that grows its own volumes on its first write.
				"-master.volumeSizeLimitMB=256", "-volume.max=100",
				"-volume.port=" + port(2), "-volume.port.grpc=" + port(3),
				"-filer", "-filer.port=" + port(4), "-filer.port.grpc=" + port(5),
				"-filer.localSocket=" + filepath.Join(sock, "filer.sock"),
				"-s3", "-s3.port=" + port(6), "-s3.port.grpc=" + port(7),
				"-s3.port.iceberg=0", "-s3.port.lance=0",
				"-s3.localSocket=" + filepath.Join(sock, "s3.sock"),
				"-s3.config=" + filepath.Join(dir, "s3.json")}, args...)...)
		if err != nil {
			return err
		}
		master := "http://" + net.JoinHostPort(addr.String(), port(0))
		return srv.waitReady(ctx, func(ctx context.Context) error {
			if err := volumeServerUp(ctx, master); err != nil {
				return err
			}
			c, err := s.newClient()
			if err != nil {
				return err
			}
			_, err = c.ListBuckets(ctx)
			return err
		})
	})
	if err == nil {
		err = s.writeProbe(ctx)
	}
	if err == nil && opts.TLS {
		// The HTTPS port answers too, with a certificate CAFile verifies.
		var c *minio.Client
		if c, err = s.tlsClient(); err == nil {
			_, err = c.ListBuckets(ctx)
		}
		if err != nil {
			err = fmt.Errorf("over TLS: %w", err)
		}
	}
	if err != nil {
		t.Fatalf("fleettest: SeaweedFS: %v", err)
	}
	return s
}

// probeBucket is the bucket writeProbe makes and removes.
const probeBucket = "fleettest-ready"

// writeProbe writes, reads back and removes an object in a bucket of its
// own, then removes the bucket. A fresh SeaweedFS holds its first write
// for several seconds (the master defers its first volume ids, the filer
// waits to join the master's lock ring); after the probe, writes are
// placed at once.
func (s *S3) writeProbe(ctx context.Context) error {
	c, err := s.newClient()
	if err != nil {
		return err
	}
	if err := c.MakeBucket(ctx, probeBucket, minio.MakeBucketOptions{Region: s.Region}); err != nil {
		return fmt.Errorf("write probe: make bucket: %w", err)
	}
	body := []byte("ready")
	if _, err := c.PutObject(ctx, probeBucket, "probe", bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
		return fmt.Errorf("write probe: put: %w", err)
	}
	o, err := c.GetObject(ctx, probeBucket, "probe", minio.GetObjectOptions{})
	if err != nil {
		return fmt.Errorf("write probe: get: %w", err)
	}
	back, err := io.ReadAll(io.LimitReader(o, 64))
	o.Close()
	if err != nil || !bytes.Equal(back, body) {
		return fmt.Errorf("write probe: read back %q, %v", back, err)
	}
	if err := c.RemoveObject(ctx, probeBucket, "probe", minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("write probe: remove: %w", err)
	}
	if err := c.RemoveBucket(ctx, probeBucket); err != nil {
		return fmt.Errorf("write probe: remove bucket: %w", err)
	}
	return nil
}

// Client returns a new minio client for the store, as its identity.
func (s *S3) Client(t testing.TB) *minio.Client {
	t.Helper()
	c, err := s.newClient()
	if err != nil {
		t.Fatalf("fleettest: S3 client: %v", err)
	}
	return c
}

// MakeBucket creates the bucket name in the store's region.
func (s *S3) MakeBucket(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Client(t).MakeBucket(ctx, name, minio.MakeBucketOptions{Region: s.Region}); err != nil {
		t.Fatalf("fleettest: make bucket %s: %v", name, err)
	}
}

func (s *S3) newClient() (*minio.Client, error) {
	return minio.New(s.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region:       s.Region,
		BucketLookup: minio.BucketLookupPath,
	})
}

// tlsClient is newClient for TLSEndpoint, trusting CAFile only.
func (s *S3) tlsClient() (*minio.Client, error) {
	b, err := os.ReadFile(s.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", s.CAFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return minio.New(s.TLSEndpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region:       s.Region,
		Secure:       true,
		Transport:    tr,
		BucketLookup: minio.BucketLookupPath,
	})
}

// volumeServerUp asks SeaweedFS's master whether a volume server has
// registered its capacity (/dir/status: Topology.Max > 0).
func volumeServerUp(ctx context.Context, master string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, master+"/dir/status", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var st struct{ Topology struct{ Max int64 } }
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&st); err != nil {
		return fmt.Errorf("master /dir/status: %s: %w", resp.Status, err)
	}
	if st.Topology.Max <= 0 {
		return fmt.Errorf("master /dir/status: no volume server yet")
	}
	return nil
}

// removeDeadSocket removes the Unix socket at path unless a process
// still accepts on it (another test's weed that got the same port since).
func removeDeadSocket(path string) {
	if st, err := os.Lstat(path); err != nil || st.Mode().Type() != os.ModeSocket {
		return
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return
	}
	os.Remove(path)
}

// randHex is n random bytes in hex.
func randHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// CredentialsFile writes the store's credentials as warren-hostd's
// --kube-s3-credentials reads them ({"access_key", "secret_key",
// "region"}, mode 0600) in a temporary directory of the test, and
// returns its path.
func (s *S3) CredentialsFile(t testing.TB) string {
	t.Helper()
	b, err := json.Marshal(map[string]string{"access_key": s.AccessKey, "secret_key": s.SecretKey, "region": s.Region})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "s3.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
