package vmmproc

import (
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// TestTrimHeapReturnsFreeHeap: megabytes of garbage left by a setup are
// returned to the host by trimHeap (the Go runtime alone keeps them
// resident while the heap is under its goal), and keep being returned
// when more is freed later. The check runs in a process of its own (this
// test binary again, running only checkTrimHeap): in the package's test
// process, VMs left by other tests make garbage of their own faster than
// a trim every 20 ms returns it (seen in the nested host).
func TestTrimHeapReturnsFreeHeap(t *testing.T) {
	if os.Getenv("WARREN_TRIMHEAP_CHECK") == "1" {
		checkTrimHeap(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTrimHeapReturnsFreeHeap$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "WARREN_TRIMHEAP_CHECK=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the check in its own process: %v\n%s", err, out)
	}
	t.Logf("the check in its own process:\n%s", out)
}

// checkTrimHeap is TestTrimHeapReturnsFreeHeap in its own process.
func checkTrimHeap(t *testing.T) {
	free := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	garbage := func() {
		var keep [][]byte
		for i := 0; i < 64; i++ {
			b := make([]byte, 128<<10)
			b[0] = 1
			keep = append(keep, b)
		}
		runtime.KeepAlive(keep)
		runtime.GC() // the garbage is free heap now, still resident
	}
	// The checks are that most of the 8 MiB of garbage goes, not that the
	// heap ends with no free memory at all.
	const slack = 1 << 20
	garbage()
	f0 := free()
	if f0 < 4<<20 {
		t.Skipf("the runtime released the garbage by itself (%d bytes free): nothing to test", f0)
	}
	stop := make(chan struct{})
	defer close(stop)
	go trimHeap(20*time.Millisecond, slack, stop)
	// A trim can release no more than the runtime's own forced release
	// (debug.FreeOSMemory, what trimHeap calls) does: now and then that
	// leaves a few MiB of free heap resident (seen: 2.6-3.3 MiB of 8 MiB,
	// in about one run in six, the scavenger's forced passes releasing
	// 32 KiB each; a runtime matter). So when most of the garbage is still
	// resident at the deadline, a forced release here tells the two
	// apart: it leaves as much (the runtime kept it: no failure) or much
	// less (the trim did not run: failure).
	wait := func(what string, from uint64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); free() > from/4; {
			if time.Now().After(deadline) {
				left := free()
				debug.FreeOSMemory()
				if floor := free(); left > floor+slack {
					t.Fatalf("%s: %d bytes of free heap still resident (%d before; a forced release leaves %d)", what, left, from, floor)
				} else {
					t.Logf("%s: %d bytes of free heap still resident (%d before), as a forced release leaves (%d): kept by the runtime", what, left, from, floor)
				}
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait("after the setup's garbage", f0)
	garbage()
	if f1 := free(); f1 >= 4<<20 {
		wait("after later garbage", f1)
	}
}
