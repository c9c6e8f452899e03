// Package serial emulates a 16550A UART (the PC's COM1) well enough for
// Linux's 8250 driver: transmit to a writer, receive from queued input,
// FIFO identification, loopback, and THR-empty / data-ready interrupts.
//
// Concurrency: a UART is driven by vCPU threads (register access) and by an
// input goroutine (Input); mu serialises both. The interrupt callback is
// called with mu held and must not call back into the UART.
package serial

import (
	"io"
	"sync"
)

// COM1 is the standard base port and ISA IRQ of the first serial port.
const (
	COM1Port = 0x3f8
	COM1IRQ  = 4
)

// Register offsets from the base port.
const (
	regData = 0 // RBR/THR, or DLL with DLAB
	regIER  = 1 // or DLM with DLAB
	regIIR  = 2 // read: IIR; write: FCR
	regLCR  = 3
	regMCR  = 4
	regLSR  = 5
	regMSR  = 6
	regSCR  = 7
)

const (
	ierRDI  = 0x01 // received data available
	ierTHRI = 0x02 // transmit holding register empty

	iirNone  = 0x01
	iirTHRI  = 0x02
	iirRDI   = 0x04
	iirFIFOs = 0xc0 // FIFOs enabled: identifies a 16550A

	lcrDLAB = 0x80

	mcrLoop = 0x10

	lsrDR   = 0x01
	lsrTHRE = 0x20
	lsrTEMT = 0x40

	msrCTS = 0x10
	msrDSR = 0x20
	msrDCD = 0x80

	rxLimit = 64 << 10 // bytes of input buffered before Input blocks the caller's data
)

// UART is one emulated 16550A.
type UART struct {
	mu            sync.Mutex
	out           io.Writer // transmit sink; mu protects writes to it
	irq           func()    // raises an edge on the UART's interrupt line
	rx            []byte    // received, not yet read by the guest
	ier, lcr, mcr byte
	scr, fcr      byte
	dll, dlm      byte
	thrPending    bool // a THR-empty interrupt is owed to the guest
	writeErr      error
}

// New returns a UART transmitting to out and raising interrupts through irq
// (which may be nil when no interrupt controller exists).
func New(out io.Writer, irq func()) *UART {
	if irq == nil {
		irq = func() {}
	}
	return &UART{out: out, irq: irq, dll: 12} // 9600 baud
}

// Input queues bytes for the guest to read; bytes beyond the buffer limit are
// dropped (a guest that never reads cannot make the VMM grow without bound).
func (u *UART) Input(b []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	room := rxLimit - len(u.rx)
	if room < len(b) {
		b = b[:max(room, 0)]
	}
	u.rx = append(u.rx, b...)
	u.update()
}

// WriteErr returns the first error from the transmit writer, if any.
func (u *UART) WriteErr() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.writeErr
}

// Read handles a guest read of the register at offset (0..7).
func (u *UART) Read(offset uint8) byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	var v byte
	switch offset {
	case regData:
		if u.lcr&lcrDLAB != 0 {
			return u.dll
		}
		if len(u.rx) > 0 {
			v = u.rx[0]
			u.rx = u.rx[1:]
		}
	case regIER:
		if u.lcr&lcrDLAB != 0 {
			return u.dlm
		}
		v = u.ier
	case regIIR:
		v = iirNone
		switch {
		case u.ier&ierRDI != 0 && len(u.rx) > 0:
			v = iirRDI
		case u.ier&ierTHRI != 0 && u.thrPending:
			v = iirTHRI
			u.thrPending = false // reading IIR acknowledges THR empty
		}
		if u.fcr&1 != 0 {
			v |= iirFIFOs
		}
	case regLCR:
		v = u.lcr
	case regMCR:
		v = u.mcr
	case regLSR:
		v = lsrTHRE | lsrTEMT
		if len(u.rx) > 0 {
			v |= lsrDR
		}
	case regMSR:
		if u.mcr&mcrLoop != 0 {
			// Loopback wires RTS->CTS, DTR->DSR, OUT1->RI, OUT2->DCD.
			m := u.mcr
			v = (m&0x02)<<3 | (m&0x01)<<5 | (m&0x04)<<4 | (m&0x08)<<4
		} else {
			v = msrDCD | msrDSR | msrCTS
		}
	case regSCR:
		v = u.scr
	}
	u.update()
	return v
}

// Write handles a guest write of v to the register at offset (0..7).
func (u *UART) Write(offset uint8, v byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch offset {
	case regData:
		if u.lcr&lcrDLAB != 0 {
			u.dll = v
			return
		}
		if u.mcr&mcrLoop != 0 {
			if len(u.rx) < rxLimit {
				u.rx = append(u.rx, v)
			}
		} else if u.writeErr == nil {
			if _, err := u.out.Write([]byte{v}); err != nil {
				u.writeErr = err
			}
		}
		u.thrPending = true // transmission is instant: THR is empty again
	case regIER:
		if u.lcr&lcrDLAB != 0 {
			u.dlm = v
			return
		}
		if v&ierTHRI != 0 && u.ier&ierTHRI == 0 {
			u.thrPending = true
		}
		u.ier = v & 0x0f
	case regIIR:
		u.fcr = v
		if v&0x02 != 0 { // clear receive FIFO
			u.rx = u.rx[:0]
		}
	case regLCR:
		u.lcr = v
	case regMCR:
		u.mcr = v & 0x1f
	case regSCR:
		u.scr = v
	}
	u.update()
}

// update raises the interrupt when one is pending and enabled. The guest
// acknowledges by reading IIR/RBR, so a pulse per access is enough for the
// edge-triggered ISA line.
func (u *UART) update() {
	if (u.ier&ierRDI != 0 && len(u.rx) > 0) || (u.ier&ierTHRI != 0 && u.thrPending) {
		u.irq()
	}
}
