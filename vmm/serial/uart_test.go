package serial

import (
	"bytes"
	"testing"
)

func TestTransmitAndTHRInterrupt(t *testing.T) {
	var out bytes.Buffer
	irqs := 0
	u := New(&out, func() { irqs++ })
	for _, c := range []byte("hi") {
		u.Write(regData, c)
	}
	if out.String() != "hi" {
		t.Fatalf("out %q", out.String())
	}
	if irqs != 0 {
		t.Errorf("%d interrupts with IER=0", irqs)
	}
	u.Write(regIER, ierTHRI)
	if irqs != 1 {
		t.Fatalf("enabling THRI raised %d interrupts, want 1", irqs)
	}
	if iir := u.Read(regIIR); iir&0x0f != iirTHRI {
		t.Errorf("IIR = %#x, want THRI", iir)
	}
	if iir := u.Read(regIIR); iir&0x0f != iirNone {
		t.Errorf("IIR after ack = %#x, want none", iir)
	}
	if lsr := u.Read(regLSR); lsr&(lsrTHRE|lsrTEMT) != lsrTHRE|lsrTEMT {
		t.Errorf("LSR = %#x", lsr)
	}
}

func TestReceive(t *testing.T) {
	irqs := 0
	u := New(&bytes.Buffer{}, func() { irqs++ })
	u.Write(regIER, ierRDI)
	u.Input([]byte("ab"))
	if irqs == 0 {
		t.Fatal("no interrupt on input")
	}
	if u.Read(regIIR)&0x0f != iirRDI || u.Read(regLSR)&lsrDR == 0 {
		t.Fatal("data not signalled")
	}
	if a, b := u.Read(regData), u.Read(regData); a != 'a' || b != 'b' {
		t.Errorf("read %c%c", a, b)
	}
	if u.Read(regLSR)&lsrDR != 0 {
		t.Error("DR set on empty FIFO")
	}
	u.Input(make([]byte, rxLimit+100))
	if len(u.rx) != rxLimit {
		t.Errorf("rx buffered %d bytes, limit %d", len(u.rx), rxLimit)
	}
}

func TestFIFOLoopbackDivisor(t *testing.T) {
	var out bytes.Buffer
	u := New(&out, nil)
	u.Write(regIIR, 0x01) // enable FIFOs
	if u.Read(regIIR)&iirFIFOs != iirFIFOs {
		t.Error("16550A FIFO bits missing")
	}
	u.Write(regLCR, lcrDLAB)
	u.Write(regData, 1)
	u.Write(regIER, 0)
	if u.Read(regData) != 1 {
		t.Error("divisor latch")
	}
	u.Write(regLCR, 0x03)
	u.Write(regMCR, mcrLoop|0x0a) // loop, RTS, OUT2
	if msr := u.Read(regMSR); msr&0xf0 != 0x90 {
		t.Errorf("loopback MSR = %#x, want 0x90", msr)
	}
	u.Write(regData, 'x')
	if out.Len() != 0 || u.Read(regData) != 'x' {
		t.Error("loopback byte not received")
	}
	u.Write(regSCR, 0x5a)
	if u.Read(regSCR) != 0x5a {
		t.Error("scratch")
	}
}

func TestStateRoundTrip(t *testing.T) {
	var out bytes.Buffer
	u := New(&out, nil)
	u.Write(regLCR, lcrDLAB)
	u.Write(regData, 1) // DLL
	u.Write(regLCR, 0x03)
	u.Write(regIER, ierRDI|ierTHRI)
	u.Write(regSCR, 0x5a)
	u.Input([]byte("ab"))
	s := u.State()
	v := New(&out, nil)
	if err := v.SetState(s); err != nil {
		t.Fatal(err)
	}
	if got := v.State(); got.IER != s.IER || got.LCR != 0x03 || got.DLL != 1 || got.SCR != 0x5a || string(got.RX) != "ab" || !got.THRPending {
		t.Errorf("restored %+v, saved %+v", got, s)
	}
	if c := v.Read(regData); c != 'a' {
		t.Errorf("first byte after restore %q", c)
	}
	for name, bad := range map[string]State{
		"ier": {IER: 0xf0}, "mcr": {MCR: 0x80}, "rx": {RX: make([]byte, rxLimit+1)},
	} {
		if err := v.SetState(bad); err == nil {
			t.Errorf("%s: bad state accepted", name)
		}
	}
}
