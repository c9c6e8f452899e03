package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/internal/kvmtest"
)

// sealState reports, for each path, whether it is sealed (true), a
// plaintext file (false), and fails the test when one is missing.
func sealState(t *testing.T, paths ...string) []bool {
	t.Helper()
	var out []bool
	for _, p := range paths {
		ok, err := isSealed(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out = append(out, ok)
	}
	return out
}

// noNeedle fails when any file under dir holds needle in plaintext.
func noNeedle(t *testing.T, dir string, needle []byte) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, de os.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, needle) {
				t.Errorf("%s holds the disk's plaintext", p)
			}
		}
		return nil
	})
}

// TestDisksSealedAtRest: for a tenant with a key, a template's disk base
// and a sandbox's overlay are sealed whenever no VMM needs them (after the
// build, after a pause to disk, when the daemon starts, after a
// revocation) and plaintext, where they are, while one does; a tenant
// without a key keeps plaintext disks; a revoked tenant's create fails
// and its disks stay sealed.
func TestDisksSealedAtRest(t *testing.T) {
	fl := newFakeLauncher(t)
	keys := newProvider(t)
	state := t.TempDir()
	needle := []byte("customer-disk-secret\n")
	data := bytes.Repeat(needle, 200000) // 4.2 MB
	gd := guestDir(t, map[string]string{"rw.img": string(data)})
	const img = "rw.img" // in the guest directory
	cfg := []func(*Config){withKeys(t, keys, ""), func(c *Config) { c.GuestDir = gd }}
	td := startDaemon(t, state, fl, cfg...)
	a := td.client(t, "acme")
	a.ok(201, "POST", "/v1/keys", nil, nil)

	var tp store.Template
	a.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "disks": []string{img}}, &tp)
	base := tp.DiskBases[0]
	if got := sealState(t, base); !got[0] {
		t.Fatal("the template's disk base is plaintext after the build")
	}
	tenantDir := filepath.Join(state, "tenants", "acme")
	noNeedle(t, tenantDir, needle)
	if fi, _ := os.Stat(base); fi.Mode().Perm() != 0o400 {
		t.Errorf("sealed base mode %v, want 0400", fi.Mode().Perm())
	}

	// While the sandbox runs, its chain is plaintext and readable.
	sb := a.create(tp.ID)
	ov := filepath.Join(state, "tenants", "acme", "sandboxes", sb.ID, "disk0.overlay")
	if got := sealState(t, base, ov); got[0] || got[1] {
		t.Fatalf("running sandbox: base sealed %v, overlay sealed %v; want both plaintext", got[0], got[1])
	}
	if fi, _ := os.Stat(base); fi.Mode().Perm() != 0o400 {
		t.Errorf("unsealed base mode %v, want 0400", fi.Mode().Perm())
	}
	o := openReading(t, ov, data)
	written := []byte("written-by-the-guest")
	if _, err := o.WriteAt(written, 3<<20); err != nil {
		t.Fatal(err)
	}
	o.Close()

	// Paused to disk: both sealed, nothing readable left.
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	if got := sealState(t, base, ov); !got[0] || !got[1] {
		t.Fatalf("suspended sandbox: base sealed %v, overlay sealed %v; want both sealed", got[0], got[1])
	}
	noNeedle(t, tenantDir, needle)
	noNeedle(t, tenantDir, written)

	// Resumed: plaintext again, with the sandbox's write.
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, nil)
	if got := sealState(t, base, ov); got[0] || got[1] {
		t.Fatalf("resumed sandbox: base sealed %v, overlay sealed %v", got[0], got[1])
	}
	o, err := disk.OpenChain(ov, true)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(written))
	o.ReadAt(buf, 3<<20)
	o.Close()
	if !bytes.Equal(buf, written) {
		t.Fatalf("after seal and unseal the overlay reads %q, want %q", buf, written)
	}

	// A VMM that exits on its own: its disks are sealed once the daemon
	// notices.
	syscall.Kill(a.get(sb.ID).PID, syscall.SIGKILL)
	kvmtest.WaitFor(t, 10*time.Second, "the exited sandbox's disks sealed", func() bool {
		g := sealState(t, base, ov)
		return g[0] && g[1]
	})
	if st := a.get(sb.ID).Status; st != store.Stopped {
		t.Fatalf("status %s after the VMM's exit", st)
	}

	// A crash that left disks plaintext (the daemon killed after an
	// unseal): sealed when the daemon starts again.
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, nil)
	pid := a.get(sb.ID).PID
	td.Close()
	<-td.done
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if g := sealState(t, base, ov); g[0] || g[1] {
		t.Fatal("setup: disks not plaintext")
	}
	td = startDaemon(t, state, fl, cfg...)
	a = td.client(t, "acme")
	if g := sealState(t, base, ov); !g[0] || !g[1] {
		t.Fatalf("after a restart with no VMM: base sealed %v, overlay sealed %v", g[0], g[1])
	}

	// A tenant without a key keeps plaintext disks.
	b := td.client(t, "bob")
	var btp store.Template
	b.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "disks": []string{img}}, &btp)
	if g := sealState(t, btp.DiskBases[0]); g[0] {
		t.Error("a tenant without a key got a sealed disk")
	}

	// Revocation while the sandbox runs: it is stopped, its disks sealed
	// (with the key as it was), and a create is refused with the
	// provider's error.
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, nil)
	if g := sealState(t, base, ov); g[0] || g[1] {
		t.Fatal("resumed after restart: disks not plaintext")
	}
	a.ok(200, "DELETE", "/v1/keys", nil, nil)
	if g := sealState(t, base, ov); !g[0] || !g[1] {
		t.Fatalf("after revocation: base sealed %v, overlay sealed %v", g[0], g[1])
	}
	noNeedle(t, tenantDir, needle)
	noNeedle(t, tenantDir, written)
	if st, body := a.do("POST", "/v1/sandboxes", map[string]any{"template": tp.ID}); st != 403 || !bytes.Contains(body, []byte("revoked")) {
		t.Errorf("create after revocation: %d %s", st, body)
	}
	if st, body := a.do("POST", "/v1/sandboxes/"+sb.ID+"/resume", nil); st != 403 {
		t.Errorf("resume after revocation: %d %s", st, body)
	}
	if g := sealState(t, base, ov); !g[0] || !g[1] {
		t.Fatal("a refused restore left disks plaintext")
	}
}
