//go:build linux

package agent

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

func testCertPEM(t *testing.T, cn string) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestApplyTrust(t *testing.T) {
	old := TrustStorePath
	TrustStorePath = filepath.Join(t.TempDir(), "etc", "ssl", "certs", "ca-certificates.crt")
	t.Cleanup(func() { TrustStorePath = old })
	a, b := testCertPEM(t, "a"), testCertPEM(t, "b")
	if err := ApplyTrust(a); err != nil {
		t.Fatal(err)
	}
	// Another certificate already there stays; ours is replaced, not appended.
	f, err := os.OpenFile(TrustStorePath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	other := testCertPEM(t, "other")
	f.WriteString(other)
	f.Close()
	if err := ApplyTrust(b); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(TrustStorePath)
	if strings.Contains(string(got), a) || !strings.Contains(string(got), b) || !strings.Contains(string(got), other) {
		t.Fatalf("trust store after two calls:\n%s", got)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(got) {
		t.Fatal("the trust store does not parse")
	}
	if err := ApplyTrust(""); err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(TrustStorePath)
	if strings.Contains(string(got), b) || !strings.Contains(string(got), other) {
		t.Fatalf("trust store after removal:\n%s", got)
	}
}

// TestSyncEgressEnv checks that placeholders a sync delivers reach the
// processes the agent starts, and that a request's own variables win.
func TestSyncEgressEnv(t *testing.T) {
	s := NewServer(ProcessWaiter{}, Options{})
	c := serve(t, s, nil)
	s.SetExtraEnv(map[string]string{"API_KEY": "warren-placeholder-API_KEY", "B": "from-sync"})
	var out bytes.Buffer
	code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", `echo "$API_KEY $B"`}, Env: []string{"B=from-request"}}, &out, nil)
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	if got := out.String(); got != "warren-placeholder-API_KEY from-request\n" {
		t.Fatalf("got %q", got)
	}
}
