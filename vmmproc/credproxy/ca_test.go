package credproxy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"
)

func TestNewCA(t *testing.T) {
	ca, err := NewCA("sb1")
	if err != nil {
		t.Fatal(err)
	}
	c := ca.Certificate()
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Fatalf("CA constraints: IsCA %v valid %v pathlen %d zero %v", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen, c.MaxPathLenZero)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("CA key is not P-256: %T", c.PublicKey)
	}
	now := time.Now()
	if d := now.Sub(c.NotBefore); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("NotBefore %v is not about an hour back", c.NotBefore)
	}
	if y := c.NotAfter.Sub(now).Hours() / 24 / 365; y < 9.9 || y > 10.1 {
		t.Fatalf("CA valid for %.1f years", y)
	}
	if !strings.Contains(c.Subject.CommonName, "sb1") {
		t.Fatalf("subject %v", c.Subject)
	}
	if bytes.Contains(ca.CertPEM(), []byte("PRIVATE")) {
		t.Fatal("CertPEM holds a key")
	}
}

func TestCAPersistence(t *testing.T) {
	ca, err := NewCA("sb1")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca2.CertPEM(), ca.CertPEM()) {
		t.Fatal("restored CA has another certificate")
	}
	// A leaf minted after the restore verifies against the trust store
	// the guest got before it.
	guestPool := x509.NewCertPool()
	if !guestPool.AppendCertsFromPEM(ca.CertPEM()) {
		t.Fatal("CertPEM does not parse")
	}
	leaf, err := ca2.Leaf("API.Test.")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: guestPool}); err != nil {
		t.Fatalf("leaf from restored CA: %v", err)
	}
	if got := leaf.Leaf.DNSNames; len(got) != 1 || got[0] != "api.test" {
		t.Fatalf("SAN %v", got)
	}
	if d := leaf.Leaf.NotAfter.Sub(time.Now()); d > 8*24*time.Hour || d < 6*24*time.Hour {
		t.Fatalf("leaf validity %v", d)
	}
	again, _ := ca2.Leaf("api.test")
	if again != leaf {
		t.Fatal("leaf not cached")
	}

	// SEC 1 keys load too; mismatched or missing keys do not.
	kb, _ := pem.Decode(keyPEM)
	k, _ := x509.ParsePKCS8PrivateKey(kb.Bytes)
	sec1, _ := x509.MarshalECPrivateKey(k.(*ecdsa.PrivateKey))
	if _, err := LoadCA(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})); err != nil {
		t.Fatalf("SEC 1 key: %v", err)
	}
	other, _ := NewCA("other")
	_, otherKey, _ := other.MarshalPEM()
	if _, err := LoadCA(certPEM, otherKey); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched key: %v", err)
	}
	if _, err := LoadCA(certPEM, nil); err == nil {
		t.Fatal("no key: no error")
	}
	if _, err := LoadCA(keyPEM, keyPEM); err == nil {
		t.Fatal("key as certificate: no error")
	}
	// A leaf certificate is not a CA.
	lp := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]})
	if _, err := LoadCA(lp, keyPEM); err == nil {
		t.Fatal("leaf as CA: no error")
	}
}

func TestLeafRenewal(t *testing.T) {
	ca, err := NewCA("sb")
	if err != nil {
		t.Fatal(err)
	}
	l1, _ := ca.Leaf("a.test")
	ca.now = func() time.Time { return time.Now().Add(6*24*time.Hour + time.Hour) }
	l2, _ := ca.Leaf("a.test")
	if l1 == l2 {
		t.Fatal("leaf near expiry not renewed")
	}
	if _, err := ca.Leaf(""); err == nil {
		t.Fatal("empty name: no error")
	}
}
