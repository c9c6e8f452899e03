package vmm

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/internal/product"

	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
)

// linuxArtifact returns build/NAME (or $ENV), ending the test by
// product.Missing when it has not been built.
func linuxArtifact(t *testing.T, env, name string) []byte {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		p = filepath.Join("..", "build", name)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		product.Missing(t, err.Error(), "make kernel initramfs")
	}
	return b
}

var uptimeLine = regexp.MustCompile(`(?m)(\d+\.\d+) \d+\.\d+\r?$`)

var linuxReady = regexp.MustCompile(`(?m)^warren-init: ready uptime=`)

// shellPrompt is the debug shell's first prompt after the ready line.
var shellPrompt = regexp.MustCompile(`(?s)warren-init: ready uptime=.*\$ `)

// TestLinuxSaveRestore boots the project's kernel with two vCPUs to its
// debug shell, saves it, restores it into a new VM and checks that the
// shell still answers over the serial console (timer, UART and interrupt
// state came across).
func TestLinuxSaveRestore(t *testing.T) {
	kvmtest.Require(t)
	if testing.Short() {
		t.Skip("skipped in -short mode: a full Linux boot")
	}
	kernel := linuxArtifact(t, "WARREN_KERNEL", "vmlinux")
	initramfs := linuxArtifact(t, "WARREN_INITRAMFS", "initramfs.cpio")
	var con syncBuffer
	cfg := Config{MemBytes: 256 << 20, CPUs: 2, Kernel: kernel, Initramfs: initramfs,
		Cmdline: "warren.shell=1 warren.agent=0", Console: &con, Profile: hostprofile.Detect("/sys/module")}
	vm, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- vm.Run(ctx) }()
	current := &con // the console waitLong reports
	running := vm   // the VM waitLong diagnoses
	var savedState *State
	waitLong := func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !cond() {
			select {
			case err := <-runErr:
				t.Fatalf("waiting for %s: Run returned %v; console:\n%s", what, err, tailString(current.String()))
			default:
			}
			if time.Now().After(deadline) {
				if savedState != nil {
					dumpState(t, "saved", savedState)
				}
				for i := 0; i < 3 && running != nil; i++ {
					if err := running.Pause(context.Background()); err != nil {
						t.Logf("diagnostic pause: %v", err)
						break
					}
					if st, err := running.SaveState(); err == nil {
						dumpState(t, "stuck", st)
					}
					running.Resume()
					time.Sleep(time.Second)
				}
				t.Fatalf("timed out waiting for %s; console:\n%s", what, tailString(current.String()))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitLong("the ready line", 4*time.Minute, func() bool { return linuxReady.MatchString(con.String()) })
	// The shell (gosh) prints its prompt once it reads the console; a fixed
	// wait for it raced its start on a slow host.
	waitLong("the shell's prompt", 2*time.Minute, func() bool { return shellPrompt.MatchString(con.String()) })
	vm.SerialInput([]byte("echo $((6*7))a\n"))
	waitLong("the shell before the save", 2*time.Minute, func() bool { return strings.Contains(con.String(), "42a") })

	t.Logf("Pause took %v", pause(t, vm))
	st, err := vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	ram := make([]byte, cfg.MemBytes)
	for _, r := range vm.Memory().Regions() {
		copy(ram[r.Offset:], vm.Memory().Host(r))
	}
	vm.Stop(nil)
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	vm.Close()
	blob, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("state: %d bytes of JSON; vCPU MP states %d/%d", len(blob), st.VCPUs[0].MPState, st.VCPUs[1].MPState)
	if st, err = UnmarshalState(blob); err != nil {
		t.Fatal(err)
	}

	var con2 syncBuffer
	cfg.Console, cfg.Kernel, cfg.Initramfs = &con2, nil, nil
	vm2, err := Restore(cfg, st, func(m *guestmem.Memory) error {
		for _, r := range m.Regions() {
			copy(m.Host(r), ram[r.Offset:r.Offset+r.Size])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	current = &con2
	runErr2 := make(chan error, 1)
	go func() { runErr2 <- vm2.Run(ctx) }()
	defer func() {
		vm2.Stop(nil)
		<-runErr2
		vm2.Close()
	}()
	runErr, running, savedState = runErr2, vm2, st
	vm2.SerialInput([]byte("echo $((7*7))b\n"))
	waitLong("the shell after the restore", time.Minute, func() bool { return strings.Contains(con2.String(), "49b") })
	// The guest's clock runs on: /proc/uptime advances with host time.
	uptimes := func() []float64 {
		var u []float64
		for _, m := range uptimeLine.FindAllStringSubmatch(con2.String(), -1) {
			f, _ := strconv.ParseFloat(m[1], 64)
			u = append(u, f)
		}
		return u
	}
	vm2.SerialInput([]byte("cat /proc/uptime\n"))
	waitLong("the first uptime", time.Minute, func() bool { return len(uptimes()) == 1 })
	time.Sleep(2 * time.Second)
	vm2.SerialInput([]byte("cat /proc/uptime\n"))
	waitLong("the second uptime", time.Minute, func() bool { return len(uptimes()) == 2 })
	if u := uptimes(); u[1]-u[0] < 1.5 || u[1]-u[0] > 60 {
		t.Errorf("guest uptime went from %.2f to %.2f in 2 s of host time", u[0], u[1])
	}
	if out := con2.String(); strings.Contains(out, "soft lockup") || strings.Contains(out, "rcu") {
		t.Errorf("the restored kernel complains:\n%s", tailString(out))
	}
	t.Logf("console after restore:\n%s", tailString(con2.String()))
}

// dumpState logs what tells where a guest is and why it might not run.
func dumpState(t *testing.T, label string, st *State) {
	t.Helper()
	for _, c := range st.VCPUs {
		msr := map[uint32]uint64{}
		for _, m := range c.MSRs {
			msr[m.Index] = m.Data
		}
		reg := func(off int) uint32 { return binary.LittleEndian.Uint32(c.LAPIC[off:]) }
		t.Logf("%s: vCPU %d mp %d rip %#x rflags %#x cr0 %#x efer %#x apicbase %#x | tsc %#x deadline %#x kvmclock %#x | lapic tpr %#x lvtt %#x tmict %#x isr %#x irr %#x | events %+v",
			label, c.ID, c.MPState, c.Regs.RIP, c.Regs.RFLAGS, c.Sregs.CR0, c.Sregs.EFER, c.Sregs.APICBase,
			msr[kvm.MSRIA32TSC], msr[kvm.MSRIA32TSCDeadline], msr[kvm.MSRKVMSystemTimeNew],
			reg(0x80), reg(0x320), reg(0x380), []uint32{reg(0x100), reg(0x110), reg(0x120), reg(0x130), reg(0x140), reg(0x150), reg(0x160), reg(0x170)},
			[]uint32{reg(0x200), reg(0x210), reg(0x220), reg(0x230), reg(0x240), reg(0x250), reg(0x260), reg(0x270)}, c.Events)
	}
	t.Logf("%s: clock %+v uart %+v", label, st.Clock, st.UART)
}

func tailString(s string) string {
	if len(s) > 3000 {
		s = s[len(s)-3000:]
	}
	return s
}
