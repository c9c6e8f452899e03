package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// choose prints "direct" when this machine's /dev/kvm runs guest
// kernel-mode code at minRate M iterations/s or more, and "nested" otherwise
// (no /dev/kvm, one that fails, or one that emulates guest ring 0).
//
// Why a rate: a Warren test suite boots Linux guests, and their time goes
// to guest kernel code. Hardware KVM runs it natively (over 1000 M
// iterations/s of the probe's loop); the nested KVM host (.ci/kvmhost,
// QEMU TCG) runs it translated, at 150-390 M/s; a PVM host in native mode
// (kvm_pvm, pvm_native=Y) emulates every guest ring-0 instruction, at
// 0.7-1.3 M/s, so a Linux boot there takes 80 s against 3-5 s in the
// nested host. The loop runs in real mode, which PVM emulates exactly as
// it emulates guest ring 0.
//
// The test itself runs the probe's guest in a child process with a
// deadline, so a /dev/kvm that hangs answers "nested" too.
func choose(minRate float64) {
	say := func(where, why string, a ...any) {
		fmt.Fprintf(os.Stderr, "probe: KVM tests run %s: "+why+"\n", append([]any{where}, a...)...)
		fmt.Println(where)
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		say("nested", "no /dev/kvm here (%v)", err)
		return
	}
	const loops = 2_000_000
	rate, err := measure(loops, 60*time.Second)
	if err != nil {
		say("nested", "/dev/kvm does not run a guest: %v", err)
		return
	}
	if rate < minRate {
		say("nested", "/dev/kvm runs guest kernel-mode code at %.1f M iter/s, under %.0f: emulated (a PVM host), the nested host's 150-390 M/s is faster", rate, minRate)
		return
	}
	say("direct", "/dev/kvm runs guest kernel-mode code at %.1f M iter/s (at least %.0f)", rate, minRate)
}

// measure runs this program again with -rate and a busy loop of loops
// iterations, and returns the loop's rate in M iterations/s. A child that
// fails or outlives timeout is an error.
func measure(loops int, timeout time.Duration) (float64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "-rate", "-irqchip=false", "-exits", "1", "-loops", strconv.Itoa(loops))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return 0, fmt.Errorf("the probe's guest did not finish in %v", timeout)
	}
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	rate, err := strconv.ParseFloat(lines[len(lines)-1], 64)
	if err != nil || rate <= 0 {
		return 0, fmt.Errorf("no rate in the probe's output %q", out)
	}
	return rate, nil
}
