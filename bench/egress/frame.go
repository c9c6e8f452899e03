package main

import "encoding/binary"

// The frames the fake guest writes into the tap and reads back are
// internal/netframe's UDP frames, whose payload starts with payloadMagic
// and a sequence number.

const (
	// payloadMagic starts every probe's payload (8 bytes).
	payloadMagic = "WRNEGRS1"
	// minPayload is the magic and the sequence number.
	minPayload = 16
)

// probePayload writes the payload of probe seq, size bytes (at least
// minPayload), into buf and returns it.
func probePayload(buf []byte, seq uint64, size int) []byte {
	size = max(size, minPayload)
	buf = append(buf[:0], payloadMagic...)
	buf = binary.BigEndian.AppendUint64(buf, seq)
	for len(buf) < size {
		buf = append(buf, byte(len(buf)))
	}
	return buf
}

// probeSeq returns the sequence number of a probe's payload.
func probeSeq(p []byte) (uint64, bool) {
	if len(p) < minPayload || string(p[:8]) != payloadMagic {
		return 0, false
	}
	return binary.BigEndian.Uint64(p[8:16]), true
}
