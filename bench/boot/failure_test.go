package main

import (
	"errors"
	"strings"
	"testing"
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
