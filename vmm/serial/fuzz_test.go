package serial

import (
	"encoding/json"
	"testing"
)

// countWriter counts the bytes the UART transmits.
type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// FuzzUART plays a guest's port I/O and the host's input against a UART,
// optionally restored first from a state blob (JSON; Validate decides):
// each operation is two bytes, the first's low bits choosing a register
// read (0), a register write (1), host input of some bytes (2) or a save
// and restore of its own state (3). The UART never panics, transmits at
// most one byte per write of the transmit register, buffers no more input
// than its limit, and what it saves always validates.
func FuzzUART(f *testing.F) {
	f.Add([]byte(`{"IER":1,"RX":"aGk="}`), []byte{1 | 3<<2, 0x80, 1, 0, 0x41, 0, 0, 2, 0x10, 0, 0, 1 | 1<<2, 0x0f, 3, 0})
	f.Add([]byte(`{}`), []byte{2, 0xff, 2, 0xff, 0, 0, 0, 0, 0, 0})
	f.Add([]byte(`{"IER":240}`), []byte{1, 0x41})
	f.Fuzz(func(t *testing.T, state, ops []byte) {
		out, irqs := &countWriter{}, 0
		u := New(out, func() { irqs++ })
		var s State
		if json.Unmarshal(state, &s) == nil {
			if err := u.SetState(s); err == nil && s.Validate() != nil {
				t.Fatal("SetState took a state that does not validate")
			}
		}
		thrWrites := 0
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i], ops[i+1]
			reg := (op >> 2) & 7
			switch op & 3 {
			case 0:
				u.Read(reg)
			case 1:
				if reg == 0 && u.State().LCR&0x80 == 0 {
					thrWrites++
				}
				u.Write(reg, arg)
			case 2:
				in := make([]byte, int(arg)<<(op>>5))
				u.Input(in)
			case 3:
				saved := u.State()
				if err := saved.Validate(); err != nil {
					t.Fatalf("the UART's own state does not validate: %v", err)
				}
				if err := u.SetState(saved); err != nil {
					t.Fatal(err)
				}
			}
			if n := len(u.State().RX); n > rxLimit {
				t.Fatalf("%d bytes of input buffered, the limit is %d", n, rxLimit)
			}
		}
		if out.n > thrWrites {
			t.Fatalf("%d bytes transmitted for %d writes of the transmit register", out.n, thrWrites)
		}
	})
}
