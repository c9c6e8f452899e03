package console

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	line := "1234 (warren (vmm)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 3 0 100 0 0"
	d, err := parseStat(line)
	if err != nil || d != 2800*time.Millisecond {
		t.Errorf("parseStat = %v, %v; want 2.8s", d, err)
	}
	// With guest_time (field 43) = 200 ticks: 250 - 200 + 30.
	full := "1234 (vmm) S" + strings.Repeat(" 0", 10) + " 250 30" + strings.Repeat(" 0", 27) + " 200 0"
	if d, err := parseStat(full); err != nil || d != 800*time.Millisecond {
		t.Errorf("parseStat with guest time = %v, %v; want 0.8s", d, err)
	}
	if _, err := parseStat("garbage"); err == nil {
		t.Error("garbage accepted")
	}
}

// A shell stands in for a guest console: Sh and Wait work on its output.
func TestShOverAShell(t *testing.T) {
	p, err := Start([]string{"sh"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	out, _, err := p.Sh("echo hello", 10*time.Second)
	if err != nil || out != "hello\n" {
		t.Fatalf("Sh = %q, %v", out, err)
	}
	// With a terminal's echo of the command line in front.
	p.stdin.Write([]byte("echo 'x; echo END-$((2000+1))-$?'\n"))
	out, _, err = p.Sh("echo second", 10*time.Second)
	if err != nil || out != "second\n" {
		t.Fatalf("Sh after an echoed line = %q, %v", out, err)
	}
	if _, _, err := p.Sh("false", 10*time.Second); err == nil {
		t.Error("failing command reported success")
	}
	p.stdin.Write([]byte("echo ready-$((40+2))\n"))
	if m, err := p.Wait(regexp.MustCompile(`ready-(\d+)`), 10*time.Second); err != nil || m[1] != "42" {
		t.Errorf("Wait = %v, %v", m, err)
	}
}
