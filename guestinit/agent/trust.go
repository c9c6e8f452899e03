//go:build linux

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/warrenvm/warren/guestinit/etc"
)

// TrustStorePath is the guest's CA bundle, the first file Go's crypto/x509
// reads on Linux, and the one Debian's OpenSSL (Python's ssl, through
// /usr/lib/ssl/cert.pem), curl and git use. In an image root it is the
// image's own bundle, which ApplyTrust appends to: PID 1 starts the agent
// (and with it the re-sync loop that applies the trust) only after it has
// moved into the image's root.
var TrustStorePath = "/etc/ssl/certs/ca-certificates.crt"

// maxTrustStore bounds the bundle ApplyTrust reads (Debian's is about
// 200 KiB).
const maxTrustStore = 16 << 20

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
	old, err := etc.ReadFile(TrustStorePath, maxTrustStore)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
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
	if err := etc.WriteFile(TrustStorePath, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	return nil
}
