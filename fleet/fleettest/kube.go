package fleettest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/csv"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/testtls"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// AdminUser is the user of Kube.Config, in group system:masters (allowed
// everything, RBAC or not). StartKube's users may not take this name.
const AdminUser = "fleettest-admin"

// kubeReadyTimeout bounds how long etcd and then kube-apiserver may take
// to answer: 2.5-4 s together on a 2-core machine, 60 s in the nested KVM
// host (.ci/kvmhost, whose CPU is emulated).
const kubeReadyTimeout = 3 * time.Minute

// serverName is the name in the apiserver's serving certificate; clients
// dial 127.0.0.1 and check this name (rest.TLSClientConfig.ServerName).
const serverName = "localhost"

// User is a user the apiserver knows by a static bearer token, with the
// groups it belongs to. Its name and groups may not hold a comma, a
// quote or a line break (the token file is CSV).
type User struct {
	Name   string
	Groups []string
}

// Kube is a running etcd and kube-apiserver pair, stopped when the test
// that started it ends.
type Kube struct {
	// Config reaches the apiserver as AdminUser. Each call of ConfigFor
	// returns a fresh copy; so may a caller copy this one (rest.CopyConfig)
	// before changing it.
	Config *rest.Config
	// Dir holds the servers' state, keys, token file and logs
	// (etcd.log, kube-apiserver.log).
	Dir string
	// tokens is each user's bearer token, AdminUser's included.
	tokens map[string]string
	// host is the apiserver's URL; caPEM the CA of its serving certificate.
	host  string
	caPEM []byte
}

// StartKube starts etcd and kube-apiserver on loopback ports, with their
// state in a temporary directory of the test, and returns once the
// apiserver's /readyz answers ok. The apiserver authenticates by static
// tokens only (one per user and one for AdminUser; no anonymous
// requests), authorizes with RBAC, serves TLS with a certificate made
// here and signs service-account tokens with a key made here. Both
// servers stop when the test ends. Tools' rules apply: without the
// binaries the test skips (fails under make test: internal/product).
func StartKube(t testing.TB, users ...User) *Kube {
	t.Helper()
	return StartKubeWith(t, KubeOptions{}, users...)
}

// KubeOptions are StartKubeWith's choices; the zero value is StartKube's.
type KubeOptions struct {
	// Addr is the address the apiserver listens on and advertises (the
	// zero Addr: 127.0.0.1). A test whose clients run in network
	// namespaces of its own gives an address of its side of their links;
	// Config and Kubeconfig then name it. etcd stays on 127.0.0.1. The
	// serving certificate's name is checked (ServerName), not the
	// address, so any address serves.
	Addr netip.Addr
}

// StartKubeWith is StartKube with opts.
func StartKubeWith(t testing.TB, opts KubeOptions, users ...User) *Kube {
	t.Helper()
	addr := "127.0.0.1"
	if opts.Addr.IsValid() {
		addr = opts.Addr.String()
	}
	tools := Tools(t)
	dir := t.TempDir()
	k := &Kube{Dir: dir, tokens: map[string]string{}}
	if err := k.writeTokens(append([]User{{Name: AdminUser, Groups: []string{"system:masters"}}}, users...)); err != nil {
		t.Fatalf("fleettest: %v", err)
	}
	caPEM, cert := testtls.Upstream(t, serverName)
	k.caPEM = caPEM
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "serving.crt"), "CERTIFICATE", cert.Certificate[0])
	writePEM(t, filepath.Join(dir, "serving.key"), "PRIVATE KEY", keyDER)
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	saDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		t.Fatal(err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "sa.key"), "PRIVATE KEY", saDER)
	writePEM(t, filepath.Join(dir, "sa.pub"), "PUBLIC KEY", saPub)

	ctx, cancel := context.WithTimeout(context.Background(), kubeReadyTimeout)
	defer cancel()
	var etcdURL string
	err = withPorts(2, func(p []int) error {
		etcdURL = "http://127.0.0.1:" + strconv.Itoa(p[0])
		peerURL := "http://127.0.0.1:" + strconv.Itoa(p[1])
		s, err := startServer(t, "etcd", dir, filepath.Join(dir, "etcd.log"), stopGrace, filepath.Join(tools, "etcd"),
			"--name=fleettest", "--data-dir="+filepath.Join(dir, "etcd"),
			"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
			"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
			"--initial-cluster=fleettest="+peerURL, "--initial-cluster-state=new",
			// A test's data dies with it: no fsync.
			"--unsafe-no-fsync")
		if err != nil {
			return err
		}
		return s.waitReady(ctx, func(ctx context.Context) error { return httpOK(ctx, nil, etcdURL+"/health", "") })
	})
	if err != nil {
		t.Fatalf("fleettest: etcd: %v", err)
	}
	admin := k.tokens[AdminUser]
	err = withPorts(1, func(p []int) error {
		k.host = "https://" + net.JoinHostPort(addr, strconv.Itoa(p[0]))
		s, err := startServer(t, "kube-apiserver", dir, filepath.Join(dir, "kube-apiserver.log"), stopGrace,
			filepath.Join(tools, "kube-apiserver"),
			"--etcd-servers="+etcdURL,
			"--bind-address="+addr, "--secure-port="+strconv.Itoa(p[0]), "--advertise-address="+addr,
			"--cert-dir="+filepath.Join(dir, "certs"),
			"--tls-cert-file="+filepath.Join(dir, "serving.crt"),
			"--tls-private-key-file="+filepath.Join(dir, "serving.key"),
			"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
			"--anonymous-auth=false",
			"--authorization-mode=RBAC",
			"--service-account-issuer=https://kubernetes.default.svc",
			"--service-account-key-file="+filepath.Join(dir, "sa.pub"),
			"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
			"--service-cluster-ip-range=10.96.0.0/24",
			// No endpoints for the "kubernetes" service: they would name
			// a loopback address, which Endpoints refuse.
			"--endpoint-reconciler-type=none")
		if err != nil {
			return err
		}
		tr, err := k.transport()
		if err != nil {
			return err
		}
		return s.waitReady(ctx, func(ctx context.Context) error { return httpOK(ctx, tr, k.host+"/readyz", admin) })
	})
	if err != nil {
		t.Fatalf("fleettest: kube-apiserver: %v", err)
	}
	k.Config = k.ConfigFor(AdminUser)
	return k
}

// ConfigFor returns a new rest.Config that reaches the apiserver as user,
// one of those given to StartKube or AdminUser. Client-side rate limits
// are set high (QPS 1000, burst 2000): tests, not the client, should
// bound the load. It panics for a user StartKube was not given.
func (k *Kube) ConfigFor(user string) *rest.Config {
	tok, ok := k.tokens[user]
	if !ok {
		panic(fmt.Sprintf("fleettest: StartKube was given no user %q", user))
	}
	return &rest.Config{
		Host:            k.host,
		BearerToken:     tok,
		TLSClientConfig: rest.TLSClientConfig{CAData: k.caPEM, ServerName: serverName},
		QPS:             1000,
		Burst:           2000,
	}
}

// Kubeconfig writes a kubeconfig file for user (as ConfigFor) in Dir and
// returns its path, for a program that takes one (warren-hostd --kube).
func (k *Kube) Kubeconfig(t testing.TB, user string) string {
	t.Helper()
	cfg := k.ConfigFor(user)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["fleettest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["fleettest"] = &clientcmdapi.Context{Cluster: "fleettest", AuthInfo: user}
	kc.CurrentContext = "fleettest"
	path := filepath.Join(k.Dir, "kubeconfig-"+user)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("fleettest: kubeconfig for %s: %v", user, err)
	}
	return path
}

// writeTokens gives each user a random token and writes the apiserver's
// token file (token,user,uid,"group,...").
func (k *Kube) writeTokens(users []User) error {
	var b strings.Builder
	w := csv.NewWriter(&b)
	for i, u := range users {
		if err := checkName(u.Name); err != nil {
			return fmt.Errorf("user %q: %w", u.Name, err)
		}
		if _, dup := k.tokens[u.Name]; dup {
			if i > 0 && u.Name == AdminUser {
				return fmt.Errorf("user %q is fleettest's own admin", u.Name)
			}
			return fmt.Errorf("user %q given twice", u.Name)
		}
		for _, g := range u.Groups {
			if err := checkName(g); err != nil {
				return fmt.Errorf("user %q: group %q: %w", u.Name, g, err)
			}
		}
		var r [24]byte
		if _, err := rand.Read(r[:]); err != nil {
			return err
		}
		tok := hex.EncodeToString(r[:])
		k.tokens[u.Name] = tok
		if err := w.Write([]string{tok, u.Name, u.Name, strings.Join(u.Groups, ",")}); err != nil {
			return err
		}
	}
	w.Flush()
	return os.WriteFile(filepath.Join(k.Dir, "tokens.csv"), []byte(b.String()), 0o600)
}

// checkName refuses what the token file cannot hold.
func checkName(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if strings.ContainsAny(s, ",\"\r\n") {
		return errors.New("holds a comma, a quote or a line break")
	}
	return nil
}

// transport trusts the apiserver's serving certificate.
func (k *Kube) transport() (http.RoundTripper, error) {
	return rest.TransportFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: k.caPEM, ServerName: serverName}})
}

// httpOK GETs url (with a bearer token unless it is empty) and wants
// status 200.
func httpOK(ctx context.Context, tr http.RoundTripper, url, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if tr == nil {
		tr = http.DefaultTransport
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body := make([]byte, 512)
		n, _ := resp.Body.Read(body)
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body[:n])
	}
	return nil
}

// writePEM writes one PEM block to path, readable by its owner only.
func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
