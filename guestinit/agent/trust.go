//go:build linux

package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// TrustStorePath is the guest's CA bundle, the first file Go's crypto/x509
// (and OpenSSL's Debian default) reads on Linux.
var TrustStorePath = "/etc/ssl/certs/ca-certificates.crt"

// Markers around the certificates ApplyTrust adds, so that the next call
// replaces them instead of appending again.
const (
	trustBegin = "# warren sandbox CA: begin\n"
	trustEnd   = "# warren sandbox CA: end\n"
)

// ApplyTrust puts the PEM certificates pemCerts into TrustStorePath,
// replacing those an earlier call put there and keeping everything else;
// an empty pemCerts removes them. The file is replaced atomically.
func ApplyTrust(pemCerts string) error {
	old, err := os.ReadFile(TrustStorePath)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("trust store: %w", err)
	}
	if i := bytes.Index(old, []byte(trustBegin)); i >= 0 {
		if j := bytes.Index(old[i:], []byte(trustEnd)); j >= 0 {
			old = append(old[:i:i], old[i+j+len(trustEnd):]...)
		}
	}
	var b bytes.Buffer
	b.Write(old)
	if pemCerts != "" {
		if b.Len() > 0 && !bytes.HasSuffix(b.Bytes(), []byte("\n")) {
			b.WriteByte('\n')
		}
		b.WriteString(trustBegin)
		b.WriteString(pemCerts)
		if pemCerts[len(pemCerts)-1] != '\n' {
			b.WriteByte('\n')
		}
		b.WriteString(trustEnd)
	}
	if err := os.MkdirAll(filepath.Dir(TrustStorePath), 0o755); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	tmp := TrustStorePath + ".warren-tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	if err := os.Rename(tmp, TrustStorePath); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("trust store: %w", err)
	}
	return nil
}
