package credproxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"time"
)

// Validity of the CA and of the leaf certificates it mints.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
	// backdate covers clock skew between the host and the guest.
	backdate = time.Hour
	// leafRenew is how long before its expiry a cached leaf is replaced.
	leafRenew = 24 * time.Hour
	// maxLeaves bounds the leaf cache (names are policy hosts, so few).
	maxLeaves = 512
)

// CA is a sandbox's certificate authority. Its certificate goes into the
// guest's trust store; its key never leaves the host. It mints, and
// caches, a leaf certificate per name on demand. It is safe for
// concurrent use.
type CA struct {
	cert    *x509.Certificate
	certDER []byte
	key     *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
	now    func() time.Time
}

// NewCA creates a CA for the sandbox called name: an ECDSA P-256 key and a
// self-signed CA certificate (path length 0) valid for about ten years,
// back-dated by an hour.
func NewCA(name string) (*CA, error) {
	key, serial, err := newKey("CA")
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"warren"},
			CommonName:   caCommonName(name),
		},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("credproxy: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("credproxy: CA certificate: %w", err)
	}
	return newCA(cert, der, key), nil
}

func newCA(cert *x509.Certificate, der []byte, key *ecdsa.PrivateKey) *CA {
	return &CA{cert: cert, certDER: der, key: key, leaves: map[string]*tls.Certificate{}, now: time.Now}
}

func caCommonName(name string) string {
	cn := "warren sandbox CA"
	if name != "" {
		cn += " " + name
	}
	if len(cn) > 64 { // the X.520 upper bound for a common name
		cn = cn[:64]
	}
	return cn
}

// newKey returns a new ECDSA P-256 key and a random serial number for a
// certificate of it; what names the key in errors ("CA", "leaf").
func newKey(what string) (*ecdsa.PrivateKey, *big.Int, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("credproxy: %s key: %w", what, err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, nil, err
	}
	return key, serial, nil
}

func randSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("credproxy: serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// LoadCA restores a CA saved with MarshalPEM (for example across a
// snapshot and restore, so that the guest's trust store stays valid). The
// key may be PKCS #8 ("PRIVATE KEY") or SEC 1 ("EC PRIVATE KEY"); it must
// match the certificate, which must be a CA certificate.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("credproxy: CA certificate: no CERTIFICATE PEM block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("credproxy: CA certificate: %w", err)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, errors.New("credproxy: CA certificate: not a CA certificate")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("credproxy: CA key: no PEM block")
	}
	var key *ecdsa.PrivateKey
	switch kb.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
		if err != nil {
			return nil, errors.New("credproxy: CA key: not a PKCS #8 key")
		}
		var ok bool
		if key, ok = k.(*ecdsa.PrivateKey); !ok {
			return nil, errors.New("credproxy: CA key: not an ECDSA key")
		}
	case "EC PRIVATE KEY":
		if key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
			return nil, errors.New("credproxy: CA key: not a SEC 1 EC key")
		}
	default:
		return nil, fmt.Errorf("credproxy: CA key: PEM block %q, want PRIVATE KEY", kb.Type)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("credproxy: CA key does not match the CA certificate")
	}
	return newCA(cert, cb.Bytes, key), nil
}

// MarshalPEM returns the CA's certificate and its key (PKCS #8), both PEM
// encoded, for the host's own storage. The key must never reach the guest.
func (ca *CA) MarshalPEM() (certPEM, keyPEM []byte, err error) {
	kder, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("credproxy: CA key: %w", err)
	}
	return ca.CertPEM(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// CertPEM returns the CA certificate, PEM encoded: what goes into the
// guest's trust store.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.certDER})
}

// Certificate returns the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Pool returns a certificate pool holding only the CA certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Leaf returns a server certificate for name (a DNS name; SAN = name),
// signed by the CA and valid for about a week, minting it on first use
// and again when the cached one is within a day of expiring.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == "" {
		return nil, errors.New("credproxy: leaf certificate: empty name")
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	now := ca.now()
	if c, ok := ca.leaves[name]; ok && now.Add(leafRenew).Before(c.Leaf.NotAfter) {
		return c, nil
	}
	c, err := ca.mint(name, now)
	if err != nil {
		return nil, err
	}
	if len(ca.leaves) >= maxLeaves {
		for n := range ca.leaves { // evict an arbitrary entry
			delete(ca.leaves, n)
			break
		}
	}
	ca.leaves[name] = c
	return c, nil
}

func (ca *CA) mint(name string, now time.Time) (*tls.Certificate, error) {
	key, serial, err := newKey("leaf")
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(leafValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{name},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("credproxy: leaf certificate for %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("credproxy: leaf certificate for %s: %w", name, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.certDER}, PrivateKey: key, Leaf: leaf}, nil
}
