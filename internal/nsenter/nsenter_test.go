package nsenter

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestNet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (ip netns add)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipped: needs iproute2's ip")
	}
	ns := fmt.Sprintf("wnsenter%d-%d", os.Getpid(), time.Now().UnixNano()%100000)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	host, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var inside string
	if err := Net(ns, func() (err error) {
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside == host || !strings.HasPrefix(inside, "net:") {
		t.Errorf("fn ran in %q, the host's is %q", inside, host)
	}
	if err := Net(ns+"-absent", func() error { return nil }); err == nil {
		t.Error("entered a namespace that does not exist")
	}
	want := fmt.Errorf("fn's error")
	if err := Net(ns, func() error { return want }); err != want {
		t.Errorf("Net returned %v, want fn's error", err)
	}
}
