package vmm

import (
	"strings"
	"testing"
	"time"
)

func TestBusRouting(t *testing.T) {
	var b Bus
	rec := &recorder{}
	if err := b.Add(0x100, 0x10, rec); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(0x108, 0x10, sink{}); err == nil {
		t.Error("overlapping range accepted")
	}
	if err := b.Add(0x200, 0, sink{}); err == nil {
		t.Error("empty range accepted")
	}
	if !b.Write(0x102, []byte("x")) || len(rec.writes) != 1 || rec.writes[0] != "2:x" {
		t.Errorf("write routed as %q", rec.writes)
	}
	d := make([]byte, 2)
	if b.Read(0x110, d) || d[0] != 0xff || d[1] != 0xff {
		t.Errorf("unclaimed read = %x", d)
	}
}

func TestPanicWatcher(t *testing.T) {
	var out strings.Builder
	p := &panicWatcher{w: &out}
	p.Write([]byte("booting\nKernel panic - not syncing: VFS: Unable"))
	p.Write([]byte(" to mount root fs\nrebooting\n"))
	if got := p.Panic(); !strings.HasPrefix(got, "Kernel panic - not syncing: VFS: Unable to mount") {
		t.Errorf("panic = %q", got)
	}
	if !strings.Contains(out.String(), "rebooting") {
		t.Error("output not passed through")
	}
}

func TestI8042Reset(t *testing.T) {
	resets := 0
	k := i8042{reset: func() { resets++ }}
	k.Write(4, []byte{0xd1})
	k.Write(0, []byte{0xfe})
	if resets != 0 {
		t.Fatal("reset on the wrong command or port")
	}
	k.Write(4, []byte{0xfe})
	if resets != 1 {
		t.Fatal("0xfe on port 0x64 did not reset")
	}
}

func TestLineBuffer(t *testing.T) {
	var out syncBuffer
	l := newLineBuffer(&out)
	l.Write([]byte("ab"))
	if out.String() != "" {
		t.Fatalf("partial line written at once: %q", out.String())
	}
	l.Write([]byte("c\nde"))
	if out.String() != "abc\n" {
		t.Fatalf("complete line not written: %q", out.String())
	}
	deadline := time.Now().Add(2 * time.Second)
	for out.String() != "abc\nde" && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if out.String() != "abc\nde" {
		t.Fatalf("partial line not flushed after the delay: %q", out.String())
	}
	l.Write([]byte("f"))
	if err := l.Flush(); err != nil || out.String() != "abc\ndef" {
		t.Fatalf("Flush: %q, %v", out.String(), err)
	}
}
