package daemon

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/kvmtest"
)

// sealedSecrets checks that the file at path is in the crypt format and
// holds none of values in the clear.
func sealedSecrets(t *testing.T, path string, values ...string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte(crypt.Magic)) {
		t.Fatalf("%s is not sealed: %q", path, b[:min(len(b), 40)])
	}
	for _, v := range values {
		if bytes.Contains(b, []byte(v)) {
			t.Fatalf("%s holds %q in the clear", path, v)
		}
	}
}

// emptyDir checks that dir holds nothing (what: else, what is there).
func emptyDir(t *testing.T, dir, what string) {
	t.Helper()
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("%s: %v", what, entries)
	}
}

// gone checks that no file is at path.
func gone(t *testing.T, path, what string) {
	t.Helper()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s: %s still there (%v)", what, path, err)
	}
}

func TestSecretsAtRest(t *testing.T) {
	fl := newFakeLauncher(t)
	keys := newProvider(t)
	state := t.TempDir()
	work := filepath.Join(t.TempDir(), "decrypted")
	td := startDaemon(t, state, fl, withKeys(t, keys, work))
	a := td.client(t, "acme")
	secFile := filepath.Join(state, "tenants", "acme", "secrets.json")

	// Written before the key: plaintext, sealed when the key is created.
	a.setSecret("API_KEY", "value-before-key")
	if b, _ := os.ReadFile(secFile); !bytes.Contains(b, []byte("value-before-key")) {
		t.Fatalf("before the key: %q", b)
	}
	a.ok(201, "POST", "/v1/keys", nil, nil)
	sealedSecrets(t, secFile, "value-before-key")

	a.setSecret("API_KEY", "value-of-api-key")
	a.setSecret("OTHER", "value-of-other")
	sealedSecrets(t, secFile, "value-of-api-key", "value-of-other")
	if fi, err := os.Stat(secFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secrets file: %v %v", fi, err)
	}
	var l wire.SecretList
	a.ok(200, "GET", "/v1/secrets", nil, &l)
	if !reflect.DeepEqual(l.Names, []string{"API_KEY", "OTHER"}) {
		t.Fatalf("names %v", l.Names)
	}

	// A network sandbox reads its secrets from the decrypt directory.
	tp := a.networkTemplate(fakeKernel(t))
	create := func() (store.Sandbox, string) {
		t.Helper()
		sb := a.createWith(map[string]any{"template": tp.ID, "egress": json.RawMessage(testPolicy), "secrets": []string{"API_KEY"}})
		fl.mu.Lock()
		sec := fl.lastRestoreSpec.Secrets
		fl.mu.Unlock()
		if want := filepath.Join(work, sb.ID+".secrets.json"); sec != want {
			t.Fatalf("--secrets %q, want %q", sec, want)
		}
		gone(t, filepath.Join(state, "tenants", "acme", "sandboxes", sb.ID, "secrets.json"), "a keyed sandbox's directory")
		return sb, sec
	}
	value := func(path string) string {
		t.Helper()
		var m map[string]string
		if mode := readJSONFile(t, path, &m); mode != 0o600 {
			t.Errorf("%s mode %v", path, mode)
		}
		if len(m) != 1 {
			t.Errorf("%s: %v, want API_KEY only", path, m)
		}
		return m["API_KEY"]
	}
	sb, sec := create()
	if v := value(sec); v != "value-of-api-key" {
		t.Fatalf("the sandbox's secret: %q", v)
	}

	// Rotation reaches it; a pause to disk removes it, a resume writes it
	// again, a delete removes it.
	a.setSecret("API_KEY", "rotated")
	if v := value(sec); v != "rotated" {
		t.Fatalf("after rotation: %q", v)
	}
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	gone(t, sec, "after a pause to disk")
	a.setSecret("API_KEY", "rotated-while-suspended")
	gone(t, sec, "rotation of a suspended sandbox")
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, nil)
	if v := value(sec); v != "rotated-while-suspended" {
		t.Fatalf("after resume: %q", v)
	}
	a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	gone(t, sec, "after delete")

	// A VMM that exits: the monitor removes its file.
	sb, sec = create()
	syscall.Kill(sb.PID, syscall.SIGKILL)
	kvmtest.WaitFor(t, 10*time.Second, "the monitor to notice", func() bool { return a.get(sb.ID).Status == store.Stopped })
	gone(t, sec, "after the VMM exited")

	// Revocation stops the running sandbox and removes its file; the
	// secrets API answers 403 and the file on disk stays sealed.
	sb, sec = create()
	a.ok(200, "DELETE", "/v1/keys", nil, nil)
	gone(t, sec, "after revocation")
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/v1/secrets", nil},
		{"PUT", "/v1/secrets/API_KEY", []byte("after-revoke")},
		{"PUT", "/v1/secrets/NEW", []byte("after-revoke")},
		{"DELETE", "/v1/secrets/API_KEY", nil},
	} {
		st, out := a.do(c.method, c.path, c.body)
		if st != 403 || !strings.Contains(string(out), "tenant acme: key revoked at") {
			t.Fatalf("%s %s after revoke: %d %s", c.method, c.path, st, out)
		}
	}
	sealedSecrets(t, secFile, "rotated-while-suspended", "value-of-other", "after-revoke")
	emptyDir(t, work, "left in the decrypt directory")
}

// TestSecretsWithoutKey: on a daemon with keys, a tenant without one keeps
// plaintext secrets, and its sandboxes' files in their directories.
func TestSecretsWithoutKey(t *testing.T) {
	fl := newFakeLauncher(t)
	state := t.TempDir()
	work := filepath.Join(t.TempDir(), "decrypted")
	td := startDaemon(t, state, fl, withKeys(t, newProvider(t), work))
	c := td.client(t, "plain")
	c.setSecret("API_KEY", "plain-value")
	secFile := filepath.Join(state, "tenants", "plain", "secrets.json")
	var m map[string]string
	if mode := readJSONFile(t, secFile, &m); mode != 0o600 || m["API_KEY"] != "plain-value" {
		t.Fatalf("secrets file: %v %v", mode, m)
	}
	tp := c.networkTemplate(fakeKernel(t))
	sb := c.createWith(map[string]any{"template": tp.ID, "egress": json.RawMessage(testPolicy), "secrets": []string{"API_KEY"}})
	sec := filepath.Join(state, "tenants", "plain", "sandboxes", sb.ID, "secrets.json")
	if got := fl.lastRestoreSpec.Secrets; got != sec {
		t.Fatalf("--secrets %q, want %q", got, sec)
	}
	c.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	if _, err := os.Stat(sec); err != nil {
		t.Fatalf("a tenant without a key lost its sandbox's file on pause: %v", err)
	}
	c.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	gone(t, sec, "after delete")
	emptyDir(t, work, "a tenant without a key wrote to the decrypt directory")
}

// TestSecretsSealedAtStart: a plaintext secrets file of a tenant with a
// key (a daemon that died before sealing it) is sealed when the daemon
// starts, and a stale sandbox file in the decrypt directory is removed.
func TestSecretsSealedAtStart(t *testing.T) {
	keys := newProvider(t)
	state := t.TempDir()
	work := filepath.Join(t.TempDir(), "decrypted")
	if _, err := keys.Create("acme"); err != nil {
		t.Fatal(err)
	}
	secFile := filepath.Join(state, "tenants", "acme", "secrets.json")
	if err := store.WriteJSON(secFile, map[string]string{"API_KEY": "left-in-plaintext"}); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(work, "sb-0123456789ab.secrets.json")
	if err := store.WriteFileAtomic(stale, []byte(`{"API_KEY":"stale"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	td := startDaemon(t, state, newFakeLauncher(t), withKeys(t, keys, work))
	sealedSecrets(t, secFile, "left-in-plaintext")
	gone(t, stale, "a stale sandbox secrets file")
	var l wire.SecretList
	td.client(t, "acme").ok(200, "GET", "/v1/secrets", nil, &l)
	if !reflect.DeepEqual(l.Names, []string{"API_KEY"}) {
		t.Fatalf("names %v", l.Names)
	}
}

// TestSecretsForkChild: a fork child's VMM reads its parent's file, which
// stays while the child runs and goes when the last of them stops.
func TestSecretsForkChild(t *testing.T) {
	fl := newFakeLauncher(t)
	keys := newProvider(t)
	work := filepath.Join(t.TempDir(), "decrypted")
	td := startDaemon(t, t.TempDir(), fl, withKeys(t, keys, work))
	a := td.client(t, "acme")
	a.ok(201, "POST", "/v1/keys", nil, nil)
	a.setSecret("API_KEY", "v1")
	tp := a.networkTemplate(fakeKernel(t))
	sb := a.createWith(map[string]any{"template": tp.ID, "secrets": []string{"API_KEY"}})
	sec := filepath.Join(work, sb.ID+".secrets.json")
	fr := a.fork(sb.ID, 1)
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	a.setSecret("API_KEY", "v2")
	var m map[string]string
	readJSONFile(t, sec, &m)
	if m["API_KEY"] != "v2" {
		t.Fatalf("the child's (parent's) file after rotation: %v", m)
	}
	a.ok(200, "DELETE", "/v1/sandboxes/"+fr.Children[0].ID, nil, nil)
	gone(t, sec, "after the last VMM reading it stopped")
}
