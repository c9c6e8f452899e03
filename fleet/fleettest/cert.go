package fleettest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"
)

// CertFiles are the PEM files ServingCert writes: a CA's certificate
// and a serving certificate (with its key) that CA signed.
type CertFiles struct {
	CA, Cert, Key string
}

// ServingCert makes a CA and a serving certificate for addrs (IP
// subject alternative names: a client that dials an address checks it
// against these), valid for a day, writes them to dir (ca.crt,
// serving-ip.crt, serving-ip.key, readable by their owner only) and
// returns their paths. Servers on addresses that clients in other
// network namespaces dial use it: S3Options.TLS, a warren-hostd's
// --tls-cert.
func ServingCert(t testing.TB, dir string, addrs ...netip.Addr) CertFiles {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleettest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafT := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "fleettest server"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, a := range addrs {
		leafT.IPAddresses = append(leafT.IPAddresses, net.IP(a.AsSlice()))
	}
	der, err := x509.CreateCertificate(rand.Reader, leafT, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := CertFiles{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "serving-ip.crt"), Key: filepath.Join(dir, "serving-ip.key")}
	writePEM(t, f.CA, "CERTIFICATE", caDER)
	writePEM(t, f.Cert, "CERTIFICATE", der)
	writePEM(t, f.Key, "PRIVATE KEY", keyDER)
	return f
}
