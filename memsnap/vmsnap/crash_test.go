package vmsnap

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/atomicfile"
)

// crashMem is the RAM of the crash test's snapshots: big enough, and
// random enough, that writing one takes a while to be killed in.
const crashMem = 32 << 20

// crashPages are the pages the crash test's snapshots hold.
func crashPages() []uint64 {
	var ps []uint64
	for p := uint64(0); p < crashMem/pageSize; p += 3 {
		ps = append(ps, p)
	}
	return ps
}

// writeGen writes generation gen of the snapshots "full" (a full one) and
// "inc" (incremental on the fixed full snapshot "base").
func writeGen(dir string, gen uint64, baseLayer string) error {
	mem := randomImage(crashMem, gen, crashPages())
	st := fakeState(crashMem)
	st.VCPUs[0].Regs.RAX = gen
	if _, err := Write(filepath.Join(dir, "full"), &Capture{Kind: Full, State: st, Fingerprint: testFP, Memory: bytes.NewReader(mem)}); err != nil {
		return err
	}
	dirty := crashPages()[:200]
	_, err := Write(filepath.Join(dir, "inc"), &Capture{Kind: Incremental, State: st, Fingerprint: testFP, Memory: bytes.NewReader(mem),
		Dirty: bitmap(crashMem, dirty), ParentLayer: baseLayer, ParentName: "base"})
	return err
}

// TestCrashWriterChild is the process TestCrashSafety kills: it writes
// generations of "full" and "inc" forever. It skips unless run by it.
func TestCrashWriterChild(t *testing.T) {
	dir := os.Getenv("WARREN_VMSNAP_CRASH_DIR")
	if dir == "" {
		t.Skip("run by TestCrashSafety")
	}
	baseLayer := os.Getenv("WARREN_VMSNAP_CRASH_BASE")
	for gen := uint64(time.Now().UnixNano()); ; gen++ {
		if err := writeGen(dir, gen, baseLayer); err != nil {
			t.Fatal(err)
		}
	}
}

// checkGen loads name and checks that it is one whole generation: the
// registers and every page agree on it.
func checkGen(t *testing.T, dir, name string) uint64 {
	t.Helper()
	s, err := Load(filepath.Join(dir, name), hostIs(testFP))
	if err != nil {
		t.Fatalf("%s does not load: %v", name, err)
	}
	defer s.Close()
	gen := s.State.VCPUs[0].Regs.RAX
	mem := readAll(t, s)
	pages := crashPages()
	if name == "inc" {
		pages = pages[:200]
	}
	for _, p := range pages {
		if g := binary.LittleEndian.Uint64(mem[p*pageSize+8:]); g != gen {
			t.Fatalf("%s: page %d is of generation %d, the registers of %d", name, p, g, gen)
		}
	}
	return gen
}

// TestCrashSafety kills (SIGKILL) a process writing snapshots at random
// points, many times, and checks after each kill that the previous
// snapshot of each name still loads whole.
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short mode")
	}
	dir := t.TempDir()
	baseState := fakeState(crashMem)
	baseState.VCPUs[0].Regs.RAX = 0 // generation 0
	base, err := Write(filepath.Join(dir, "base"), &Capture{Kind: Full, State: baseState, Fingerprint: testFP,
		Memory: bytes.NewReader(randomImage(crashMem, 0, crashPages()))})
	if err != nil {
		t.Fatal(err)
	}
	if err := writeGen(dir, 1, base.LayerPath); err != nil {
		t.Fatal(err)
	}
	runs := 24
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var lastFull, lastInc uint64 = 1, 1
	midWrite := 0
	for i := range runs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashWriterChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "WARREN_VMSNAP_CRASH_DIR="+dir, "WARREN_VMSNAP_CRASH_BASE="+base.LayerPath)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(50+r.IntN(1500)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		err := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("run %d: the writer ended on its own (%v):\n%s", i, err, out.String())
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if atomicfile.IsTemp(e.Name()) {
				midWrite++
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
		f, n := checkGen(t, dir, "full"), checkGen(t, dir, "inc")
		if f < lastFull || n < lastInc {
			t.Fatalf("run %d: went back a generation", i)
		}
		lastFull, lastInc = f, n
		checkGen(t, dir, "base")
	}
	t.Logf("%d kills, %d left a temporary file behind (killed mid-write); every snapshot loaded after each", runs, midWrite)
}
