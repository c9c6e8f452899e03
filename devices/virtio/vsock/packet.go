package vsock

// Everything decoded here comes from the guest and is validated before use.

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderLen is the size of struct virtio_vsock_hdr.
const HeaderLen = 44

// Well-known CIDs.
const (
	CIDHost = 2
)

// TypeStream is the only socket type Warren's device carries.
const TypeStream = 1

// Operations (virtio 1.2, 5.10.6.4).
const (
	OpInvalid       = 0
	OpRequest       = 1
	OpResponse      = 2
	OpRst           = 3
	OpShutdown      = 4
	OpRW            = 5
	OpCreditUpdate  = 6
	OpCreditRequest = 7
)

// Shutdown flags.
const (
	ShutdownRecv = 1
	ShutdownSend = 2
)

// MaxPayload bounds the data one packet may carry; larger lengths are
// refused (Linux sends at most 64 KiB per packet).
const MaxPayload = 64 << 10

// ErrBadPacket is wrapped by every validation failure.
var ErrBadPacket = errors.New("vsock: bad packet")

// Header is struct virtio_vsock_hdr.
type Header struct {
	SrcCID   uint64
	DstCID   uint64
	SrcPort  uint32
	DstPort  uint32
	Len      uint32
	Type     uint16
	Op       uint16
	Flags    uint32
	BufAlloc uint32
	FwdCnt   uint32
}

// ParseHeader decodes and validates a header from the guest: the stream
// type, a known operation, a payload only on RW and within MaxPayload,
// shutdown flags only on SHUTDOWN.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("%w: %d-byte header, want %d", ErrBadPacket, len(b), HeaderLen)
	}
	le := binary.LittleEndian
	h := Header{
		SrcCID: le.Uint64(b[0:]), DstCID: le.Uint64(b[8:]),
		SrcPort: le.Uint32(b[16:]), DstPort: le.Uint32(b[20:]),
		Len: le.Uint32(b[24:]), Type: le.Uint16(b[28:]), Op: le.Uint16(b[30:]),
		Flags: le.Uint32(b[32:]), BufAlloc: le.Uint32(b[36:]), FwdCnt: le.Uint32(b[40:]),
	}
	return h, h.Validate()
}

// Validate checks the header's fields against each other.
func (h Header) Validate() error {
	switch {
	case h.Type != TypeStream:
		return fmt.Errorf("%w: socket type %d, only stream (1) is supported", ErrBadPacket, h.Type)
	case h.Op == OpInvalid || h.Op > OpCreditRequest:
		return fmt.Errorf("%w: operation %d", ErrBadPacket, h.Op)
	case h.Len > MaxPayload:
		return fmt.Errorf("%w: payload of %d bytes, at most %d", ErrBadPacket, h.Len, MaxPayload)
	case h.Len != 0 && h.Op != OpRW:
		return fmt.Errorf("%w: %d payload bytes on operation %d", ErrBadPacket, h.Len, h.Op)
	case h.Op == OpShutdown && h.Flags&^(ShutdownRecv|ShutdownSend) != 0:
		return fmt.Errorf("%w: shutdown flags %#x", ErrBadPacket, h.Flags)
	case h.Op != OpShutdown && h.Flags != 0:
		return fmt.Errorf("%w: flags %#x on operation %d", ErrBadPacket, h.Flags, h.Op)
	}
	return nil
}

// Encode writes the header into b (at least HeaderLen bytes).
func (h Header) Encode(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], h.SrcCID)
	le.PutUint64(b[8:], h.DstCID)
	le.PutUint32(b[16:], h.SrcPort)
	le.PutUint32(b[20:], h.DstPort)
	le.PutUint32(b[24:], h.Len)
	le.PutUint16(b[28:], h.Type)
	le.PutUint16(b[30:], h.Op)
	le.PutUint32(b[32:], h.Flags)
	le.PutUint32(b[36:], h.BufAlloc)
	le.PutUint32(b[40:], h.FwdCnt)
}
