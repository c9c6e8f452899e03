//go:build linux

package guestinit

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDevLinksPointAtProcSelfFD(t *testing.T) {
	for _, l := range devLinks {
		if filepath.Dir(l[1]) != "/dev" {
			t.Errorf("%s is not in /dev", l[1])
		}
	}
	// The targets resolve in this process as they will in the guest.
	if _, err := os.Stat("/proc/self/fd/1"); err != nil {
		t.Skip("no /proc here")
	}
	want := map[string]string{"/dev/stdout": "/proc/self/fd/1", "/dev/stdin": "/proc/self/fd/0", "/dev/stderr": "/proc/self/fd/2"}
	for _, l := range devLinks {
		if w, ok := want[l[1]]; ok && w != l[0] {
			t.Errorf("%s -> %s, want %s", l[1], l[0], w)
		}
	}
}
