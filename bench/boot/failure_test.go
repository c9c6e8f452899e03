package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestFailureKind(t *testing.T) {
	for msg, want := range map[string]string{
		`no ready line (last output: []; stderr: "warren run: vmm: vCPU 0: triple fault (KVM_EXIT_SHUTDOWN) at rip 0x1000")`: "triple-fault",
		`timed out after 10m0s with no ready line (last output: []; stderr: "")`:                                             "timeout",
		`no ready line (last output: ["reboot: Restarting system"]; stderr: "")`:                                             "no-ready",
	} {
		if got := failureKind(errors.New(msg)); got != want {
			t.Errorf("%s: %s, want %s", msg, got, want)
		}
	}
}

func TestTailBuffer(t *testing.T) {
	var b tailBuffer
	b.Write([]byte(strings.Repeat("a", 3000)))
	b.Write([]byte("end"))
	if s := b.String(); len(s) != 2048 || !strings.HasSuffix(s, "aend") {
		t.Errorf("tail of %d bytes ending %q", len(s), s[len(s)-4:])
	}
}

// A boot that never gets ready is described before it is killed, and the
// description ends the error; a ready one is never described.
func TestTimeToReadyDescribesStall(t *testing.T) {
	described := 0
	describe := func() string { described++; return "; the guest: vcpu 0 halted" }
	_, _, err := timeToReady([]string{"sh", "-c", "echo booting; exec sleep 30"}, 300*time.Millisecond, describe)
	if err == nil || !strings.HasPrefix(err.Error(), "timed out") || !strings.HasSuffix(err.Error(), "vcpu 0 halted") {
		t.Fatalf("stalled boot: %v", err)
	}
	if failureKind(err) != "timeout" || described != 1 {
		t.Fatalf("kind %s, described %d times", failureKind(err), described)
	}
	described = 0
	d, up, err := timeToReady([]string{"sh", "-c", "echo 'warren-init: ready uptime=1.25'"}, 5*time.Second, describe)
	if err != nil || up != 1.25 || d <= 0 || described != 0 {
		t.Fatalf("ready boot: %v, %v, uptime %v, described %d times", d, err, up, described)
	}
}
