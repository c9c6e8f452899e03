package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"
)

// The clock and RNG re-sync protocol. A snapshot restore (or a fork)
// resumes the guest with the clock and the kernel's random pool of the
// moment the snapshot was taken: every clone would share its "random"
// numbers and its notion of now. So the guest keeps one vsock connection
// open to the host's re-sync service (CID 2, port SyncPort):
//
//  1. the guest connects;
//  2. the host writes one line, a JSON SyncMessage ending in '\n', at most
//     MaxSyncLine bytes;
//  3. the guest sets CLOCK_REALTIME and adds the entropy to its pool;
//  4. both keep the connection open, sending nothing more; the host reads
//     until EOF.
//
// Restoring a snapshot resets every guest vsock connection (the device's
// TRANSPORT_RESET event); the guest sees its connection fail, reconnects,
// and gets a fresh line. That is how the guest learns it was restored.

// SyncEntropyBytes is how much entropy ServeSync sends.
const SyncEntropyBytes = 64

// MaxSyncEntropy bounds the entropy a guest accepts in one message.
const MaxSyncEntropy = 512

// MaxSyncLine bounds the length of a SyncMessage line, newline included.
const MaxSyncLine = 4096

// SyncMessage is the one line the host sends on a re-sync connection.
type SyncMessage struct {
	// UnixNanos is the host's CLOCK_REALTIME in nanoseconds since the Unix
	// epoch, taken just before sending.
	UnixNanos int64 `json:"unix_nanos"`
	// Entropy is random bytes from the host's CSPRNG (standard base64 in
	// JSON), 1 to MaxSyncEntropy of them.
	Entropy []byte `json:"entropy"`
}

// NewSyncMessage returns a message for now with SyncEntropyBytes bytes
// from crypto/rand.
func NewSyncMessage(now time.Time) SyncMessage {
	m := SyncMessage{UnixNanos: now.UnixNano(), Entropy: make([]byte, SyncEntropyBytes)}
	rand.Read(m.Entropy) // never fails (crypto/rand crashes the program instead)
	return m
}

// MarshalLine encodes m as a protocol line, with its newline.
func (m SyncMessage) MarshalLine() []byte {
	b, _ := json.Marshal(m) // cannot fail: an int64 and a []byte
	return append(b, '\n')
}

// ParseSyncMessage decodes one line (with or without its newline) from
// the host. Everything in it is checked: the time must be after the epoch
// and the entropy 1 to MaxSyncEntropy bytes long.
func ParseSyncMessage(line []byte) (SyncMessage, error) {
	var m SyncMessage
	if len(line) > MaxSyncLine {
		return m, fmt.Errorf("sync: line of %d bytes exceeds %d", len(line), MaxSyncLine)
	}
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&m); err != nil {
		return SyncMessage{}, fmt.Errorf("sync: decode: %w", err)
	}
	if d.More() {
		return SyncMessage{}, fmt.Errorf("sync: trailing data after the message")
	}
	if m.UnixNanos <= 0 {
		return SyncMessage{}, fmt.Errorf("sync: time %d not after the epoch", m.UnixNanos)
	}
	if len(m.Entropy) == 0 || len(m.Entropy) > MaxSyncEntropy {
		return SyncMessage{}, fmt.Errorf("sync: %d bytes of entropy, want 1 to %d", len(m.Entropy), MaxSyncEntropy)
	}
	return m, nil
}

// ServeSync is the host side of one re-sync connection: it writes the line
// for time.Now() with fresh entropy, then reads (and discards) until the
// guest closes the connection or it fails, and closes it. The VMM runs it
// on its own goroutine for each guest connection to SyncPort.
func ServeSync(c net.Conn) {
	defer c.Close()
	if _, err := c.Write(NewSyncMessage(time.Now()).MarshalLine()); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}
