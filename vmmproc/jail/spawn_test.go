//go:build linux && amd64

package jail

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/vmmproc/jail/jailtest"
)

// spawnedVerb makes this test binary, started by Spawner, write what it
// runs as (and what its descriptor 3 holds) to its standard output.
const spawnedVerb = "spawned-report"

func spawnedReport() int {
	st, _ := os.ReadFile("/proc/self/status")
	cg, _ := os.ReadFile("/proc/self/cgroup")
	in, _ := io.ReadAll(os.NewFile(3, "in"))
	for _, l := range strings.Split(string(st), "\n") {
		for _, k := range []string{"Uid:", "Gid:", "Groups:", "CapEff:", "CapAmb:"} {
			if strings.HasPrefix(l, k) {
				fmt.Println(strings.Join(strings.Fields(l), " "))
			}
		}
	}
	fmt.Printf("sid-is-self: %v\n", unix.Getpid() == mustSid())
	fmt.Printf("fd3: %s\n", in)
	fmt.Printf("env: %s\n", os.Getenv(SpawnEnv))
	_, err := os.Stat("/etc")
	fmt.Printf("etc: %v\n", err == nil)
	if os.Getenv("SPAWN_TEST_WAIT") != "" {
		io.Copy(io.Discard, os.Stdin) // a requester: there until the test closes stdin
	}
	fmt.Print(string(cg))
	return 0
}

func mustSid() int {
	sid, _ := unix.Getsid(0)
	return sid
}

// testCgroupRoot makes a cgroup for the test under a cgroup hierarchy
// this host has (v2, else v1's memory controller) and returns the root
// and the group's name; it skips without one.
func testCgroupRoot(t *testing.T) (root, name string) {
	t.Helper()
	for _, r := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(r, "cgroup.procs")); err != nil {
			continue
		}
		name = fmt.Sprintf("warren-spawn-test-%d", os.Getpid())
		if err := os.Mkdir(filepath.Join(r, name), 0o755); err != nil {
			continue
		}
		t.Cleanup(func() {
			for i := 0; i < 50 && os.Remove(filepath.Join(r, name)) != nil; i++ {
				time.Sleep(20 * time.Millisecond) // its last process is being reaped
			}
		})
		return r, name
	}
	t.Skip("no writable cgroup hierarchy here")
	return "", ""
}

// worldExe is helperExe copied where any uid may run it (the spawned
// child execs it after leaving root).
func worldExe(t *testing.T) string {
	b, err := os.ReadFile(jailtest.Exe(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	p := filepath.Join(dir, "jail.test")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSpawn: a child started under a grant runs as the grant's uid, gid
// and groups, with no capability (CAP_BPF alone when granted), in its own
// session, inside the grant's cgroup from its first instruction, with the
// descriptors it was given; a grant is good for one child only.
func TestSpawn(t *testing.T) {
	needRoot(t)
	root, name := testCgroupRoot(t)
	s, key := testSpawner(t, []string{root}, worldExe(t))
	for _, bpf := range []bool{false, true} {
		signed, err := NewGrant(key, Grant{UID: 54321, GID: 54322, Groups: []int{54323, 54324}, Cgroup: name, BPF: bpf})
		if err != nil {
			t.Fatal(err)
		}
		got, ws := spawnChild(t, s, signed, "hello child", os.Getpid())
		caps := "CapEff: 0000000000000000"
		if bpf {
			caps = fmt.Sprintf("CapEff: %016x", uint64(1)<<unix.CAP_BPF)
		}
		for _, want := range []string{"Uid: 54321 54321 54321 54321", "Gid: 54322 54322 54322 54322", "Groups: 54323 54324",
			caps, "sid-is-self: true", "fd3: hello child", "env: 1", "/" + name + "\n"} {
			if !strings.Contains(got, want) {
				t.Errorf("bpf=%v: the child's report lacks %q:\n%s", bpf, want, got)
			}
		}
		if ws.ExitStatus() != 0 {
			t.Errorf("the child exited %v", ws)
		}
		if _, _, err := s.Spawn(signed, []string{spawnedVerb}, []*os.File{os.Stderr}, os.Getpid()); err == nil || !strings.Contains(err.Error(), "already used") {
			t.Errorf("a second child under the same grant: %v", err)
		}
	}
	other, _ := NewGrant(key, Grant{UID: 5, GID: 5, Cgroup: "no-such-group"})
	if _, _, err := s.Spawn(other, []string{spawnedVerb}, []*os.File{os.Stderr}, os.Getpid()); err == nil {
		t.Error("a child was started for a cgroup that does not exist")
	}
	fresh, _ := NewGrant(key, Grant{UID: 5, GID: 5})
	if _, _, err := s.Spawn(fresh, []string{spawnedVerb}, []*os.File{os.Stderr}, 0); err == nil {
		t.Error("a child was started for a requester of unknown pid (whose root it takes)")
	}
}

// TestSpawnTakesRequestersRoot: a child takes the root of the family
// member that asked for it, not jail-init's (which stays the host's where
// the jail could only chroot, on an initramfs, as in the nested KVM
// host): spawned for a requester chrooted into a directory, it sees that
// directory's tree, not the host's.
func TestSpawnTakesRequestersRoot(t *testing.T) {
	needRoot(t)
	exe := worldExe(t)
	jailDir := t.TempDir()
	os.Chmod(jailDir, 0o755)
	// The jail holds the binary at its own path (the daemon binds it so)
	// and a /proc, as a VMM's jail does.
	inJail := filepath.Join(jailDir, exe)
	if err := os.MkdirAll(filepath.Dir(inJail), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inJail, b, 0o755); err != nil {
		t.Fatal(err)
	}
	proc := filepath.Join(jailDir, "proc")
	os.Mkdir(proc, 0o555)
	if err := unix.Mount("proc", proc, "proc", 0, ""); err != nil {
		t.Skipf("mount /proc in the test jail: %v", err)
	}
	defer unix.Unmount(proc, unix.MNT_DETACH)
	// The requester: a process chrooted into jailDir (this binary,
	// waiting on its stdin).
	req := exec.Command(exe, spawnedVerb)
	req.SysProcAttr = &syscall.SysProcAttr{Chroot: jailDir}
	stdin, err := req.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	req.Env = append(os.Environ(), "SPAWN_TEST_WAIT=1")
	var reqOut bytes.Buffer
	req.Stdout = &reqOut
	if err := req.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); req.Wait() }()

	s, key := testSpawner(t, nil, exe)
	signed, _ := NewGrant(key, Grant{UID: 54321, GID: 54321})
	out, _ := spawnChild(t, s, signed, "", req.Process.Pid)
	if !strings.Contains(out, "etc: false") || !strings.Contains(out, "Uid: 54321") {
		t.Errorf("the child spawned for a requester chrooted in %s sees the host's /etc, or did not run:\n%s", jailDir, out)
	}
}

// testSpawner returns a Spawner for the test's family key (also
// returned) and the cgroup roots, starting exe; the test's end closes it.
func testSpawner(t *testing.T, cgroupRoots []string, exe string) (*Spawner, []byte) {
	t.Helper()
	key := FamilyKey([]byte("secret"), t.Name())
	s, err := NewSpawner(key, cgroupRoots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	s.exe, s.start = exe, exe // a CGO_ENABLED=0 helper, unlike this test binary
	return s, key
}

// spawnChild spawns spawnedVerb under the grant signed for requester, with
// a pipe it reports on as its standard output and one that holds input as
// its descriptor 3, and returns the report and the child's wait status.
func spawnChild(t *testing.T, s *Spawner, signed, input string, requester int) (string, unix.WaitStatus) {
	t.Helper()
	outR, outW, _ := os.Pipe()
	inR, inW, _ := os.Pipe()
	fmt.Fprint(inW, input)
	inW.Close()
	pid, pidfd, err := s.Spawn(signed, []string{spawnedVerb}, []*os.File{outW, inR}, requester)
	outW.Close()
	inR.Close()
	if err != nil {
		t.Fatal(err)
	}
	if pidfd != nil {
		pidfd.Close()
	}
	var out bytes.Buffer
	io.Copy(&out, outR)
	outR.Close()
	var ws unix.WaitStatus
	unix.Wait4(pid, &ws, 0, nil)
	return out.String(), ws
}
