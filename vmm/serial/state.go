package serial

import "fmt"

// State is a UART's guest-visible register state, for snapshots. The
// transmit side keeps nothing (transmission is instant); RX holds the input
// the guest has not read yet.
type State struct {
	IER, LCR, MCR, SCR, FCR, DLL, DLM uint8
	THRPending                        bool
	RX                                []byte `json:",omitempty"`
}

// State returns the UART's current state. Take it while no vCPU can access
// the UART (the VM is paused); input arriving meanwhile is included or not.
func (u *UART) State() State {
	u.mu.Lock()
	defer u.mu.Unlock()
	return State{IER: u.ier, LCR: u.lcr, MCR: u.mcr, SCR: u.scr, FCR: u.fcr, DLL: u.dll, DLM: u.dlm,
		THRPending: u.thrPending, RX: append([]byte(nil), u.rx...)}
}

// Validate checks a state read from outside (a snapshot file): register
// values within what the guest could have written, input within the limit.
func (s State) Validate() error {
	if len(s.RX) > rxLimit {
		return fmt.Errorf("serial: state holds %d bytes of input, more than the %d a UART buffers", len(s.RX), rxLimit)
	}
	if s.IER&^0x0f != 0 || s.MCR&^0x1f != 0 {
		return fmt.Errorf("serial: state has reserved IER/MCR bits set (IER %#x, MCR %#x)", s.IER, s.MCR)
	}
	return nil
}

// SetState replaces the UART's state (after Validate). It raises no
// interrupt: one already raised is part of the saved irqchip state.
func (u *UART) SetState(s State) error {
	if err := s.Validate(); err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ier, u.lcr, u.mcr, u.scr, u.fcr, u.dll, u.dlm = s.IER, s.LCR, s.MCR, s.SCR, s.FCR, s.DLL, s.DLM
	u.thrPending = s.THRPending
	u.rx = append(u.rx[:0], s.RX...)
	return nil
}

// RaisePending raises the interrupt if the UART has one pending and
// enabled. A restored VM calls it once its vCPUs exist: an edge raised
// before that (input that arrived during the restore) reached no LAPIC and
// was lost. A spurious edge is harmless: the guest reads IIR and finds
// nothing.
func (u *UART) RaisePending() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.update()
}
