package cli

import (
	"bytes"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDaemonHTTPS: the daemon verbs reach an https:// daemon with the
// operator's CA (--ca-file, or $WARREN_CA, also as a leading flag), and
// refuse one whose certificate they cannot verify.
func TestDaemonHTTPS(t *testing.T) {
	var auth string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte("[]\n"))
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	t.Setenv("WARREN_TOKEN", "token-of-a-0123456789")
	t.Setenv("WARREN_CA", "")
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := Main(args, strings.NewReader(""), &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, out := run("ls", "--host", srv.URL, "--ca-file", ca); code != 0 {
		t.Fatalf("ls with the CA: %d %s", code, out)
	}
	if auth != "Bearer token-of-a-0123456789" {
		t.Errorf("Authorization %q", auth)
	}
	if code, out := run("--host", srv.URL, "--ca-file", ca, "ls"); code != 0 {
		t.Fatalf("ls with leading flags: %d %s", code, out)
	}
	t.Setenv("WARREN_CA", ca)
	if code, out := run("ls", "--host", srv.URL); code != 0 {
		t.Fatalf("ls with $WARREN_CA: %d %s", code, out)
	}
	t.Setenv("WARREN_CA", "")
	if code, out := run("ls", "--host", srv.URL); code == 0 || !strings.Contains(out, "certificate") {
		t.Fatalf("ls without the CA: %d %s; want a certificate error", code, out)
	}
	if code, out := run("ls", "--host", "http://127.0.0.1:1", "--ca-file", ca); code == 0 || !strings.Contains(out, "https") {
		t.Fatalf("a CA file for an http daemon: %d %s", code, out)
	}
}
