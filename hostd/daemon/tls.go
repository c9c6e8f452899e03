package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
)

// ServerTLS returns the TLS configuration of the daemon's TCP listener:
// the operator's certificate and key (PEM files), TLS 1.2 at least and,
// with clientCA (a PEM file of roots) set, mutual TLS: a client without a
// certificate that chains to those roots is refused in the handshake,
// before any request is read. The tenant is still the bearer token's.
func ServerTLS(certFile, keyFile, clientCA string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("TLS needs both a certificate and a key")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pool, err := loadPool(clientCA)
		if err != nil {
			return nil, fmt.Errorf("client CA: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificates", path)
	}
	return pool, nil
}

// CheckPlainTCP refuses to serve the API in plain HTTP (bearer tokens in
// cleartext) on addr unless addr is a loopback address or insecure says
// the operator accepts it (warren-hostd --insecure-tcp). An empty host
// (":8080") listens on every interface and is not loopback.
func CheckPlainTCP(addr string, insecure bool) error {
	if insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Unmap().IsLoopback() {
		return nil
	}
	return fmt.Errorf("%s is not a loopback address: serve TLS (--tls-cert, --tls-key) or pass --insecure-tcp", addr)
}
