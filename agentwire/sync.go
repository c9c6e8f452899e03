package agentwire

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/warrenvm/warren/internal/strictjson"
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

// SyncEntropyBytes is how much entropy NewSyncMessage draws: what the
// host's re-sync service (agentclient) sends.
const SyncEntropyBytes = 64

// MaxSyncEntropy bounds the entropy a guest accepts in one message.
const MaxSyncEntropy = 512

// MaxSyncLine bounds the length of a SyncMessage line, newline included
// (a sandbox's trust store certificate and credential placeholders make
// it longer than the time and entropy alone).
const MaxSyncLine = 64 << 10

// SyncMessage is the one line the host sends on a re-sync connection.
type SyncMessage struct {
	// UnixNanos is the host's CLOCK_REALTIME in nanoseconds since the Unix
	// epoch, taken just before sending.
	UnixNanos int64 `json:"unix_nanos"`
	// Entropy is random bytes from the host's CSPRNG (standard base64 in
	// JSON), 1 to MaxSyncEntropy of them.
	Entropy []byte `json:"entropy"`
	// Identity, when set, is who the guest is now: a forked child gets a
	// new one (hostname, machine id, MAC) with its first sync.
	Identity *Identity `json:"identity,omitempty"`
	// Egress, when set, is what the guest needs to use the host's egress
	// services: the credential proxy's CA certificate and the credential
	// placeholders (see Egress).
	Egress *Egress `json:"egress,omitempty"`
}

// Limits on an Egress.
const (
	MaxTrustPEM   = 16 << 10
	MaxEgressEnv  = 128
	MaxEnvValue   = 4096
	maxEnvNameLen = 128
)

// Egress is the guest's side of the sandbox's egress configuration. It
// holds nothing secret: the CA certificate (never its key) and the
// placeholders the host proxy replaces with real credentials.
type Egress struct {
	// TrustPEM is PEM "CERTIFICATE" blocks the agent adds to the guest's
	// trust store (guestinit/agent's TrustStorePath), replacing those an
	// earlier sync added.
	TrustPEM string `json:"trust_pem,omitempty"`
	// Env is environment variables for every process the agent starts
	// from now on (a request's own variables still win): the credential
	// placeholders, named after their secrets.
	Env map[string]string `json:"env,omitempty"`
}

// Check validates e: PEM certificates only, environment names of
// letters, digits and '_' not starting with a digit, no NUL in values,
// and the size limits.
func (e *Egress) Check() error {
	if len(e.TrustPEM) > MaxTrustPEM {
		return fmt.Errorf("egress: trust PEM of %d bytes, at most %d", len(e.TrustPEM), MaxTrustPEM)
	}
	rest := []byte(e.TrustPEM)
	for len(bytes.TrimSpace(rest)) > 0 {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil || b.Type != "CERTIFICATE" {
			return errors.New("egress: trust PEM holds something other than CERTIFICATE blocks")
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("egress: trust PEM: %w", err)
		}
	}
	if len(e.Env) > MaxEgressEnv {
		return fmt.Errorf("egress: %d environment variables, at most %d", len(e.Env), MaxEgressEnv)
	}
	for k, v := range e.Env {
		if !validEnvName(k) {
			return fmt.Errorf("egress: environment name %q", k)
		}
		if len(v) > MaxEnvValue || strings.ContainsRune(v, 0) {
			return fmt.Errorf("egress: environment value of %s is longer than %d bytes or has a NUL", k, MaxEnvValue)
		}
	}
	return nil
}

func validEnvName(k string) bool {
	if k == "" || len(k) > maxEnvNameLen || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Identity is what makes a sandbox distinct from its fork siblings, as
// far as the guest can be told: the agent applies each field that is set.
type Identity struct {
	// Hostname is set with sethostname(2): 1 to 64 bytes of letters,
	// digits, '-' and '.'.
	Hostname string `json:"hostname,omitempty"`
	// MachineID is written to /etc/machine-id: 32 lowercase hex digits.
	MachineID string `json:"machine_id,omitempty"`
	// MAC is set on the guest's first Ethernet interface (the virtio-net
	// device), in the form 02:00:00:00:00:01.
	MAC string `json:"mac,omitempty"`
}

// Check validates every field that is set.
func (id *Identity) Check() error {
	if h := id.Hostname; h != "" {
		if len(h) > 64 {
			return fmt.Errorf("identity: hostname of %d bytes, at most 64", len(h))
		}
		for _, c := range h {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
				return fmt.Errorf("identity: hostname %q has a character other than letters, digits, '-' and '.'", h)
			}
		}
	}
	if m := id.MachineID; m != "" {
		if len(m) != 32 {
			return fmt.Errorf("identity: machine id %q is not 32 hex digits", m)
		}
		for _, c := range m {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return fmt.Errorf("identity: machine id %q is not 32 lowercase hex digits", m)
			}
		}
	}
	if id.MAC != "" {
		hw, err := net.ParseMAC(id.MAC)
		if err != nil || len(hw) != 6 {
			return fmt.Errorf("identity: MAC %q is not a 6-byte Ethernet address", id.MAC)
		}
	}
	return nil
}

// NewMachineID returns a random machine id (a version 4 UUID's 32 hex
// digits, as systemd-machine-id-setup makes them).
func NewMachineID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x", b[:])
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
	b, _ := json.Marshal(m) // cannot fail: plain fields
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
	if err := strictjson.Unmarshal(line, &m); err != nil {
		return SyncMessage{}, fmt.Errorf("sync: decode: %w", err)
	}
	if m.UnixNanos <= 0 {
		return SyncMessage{}, fmt.Errorf("sync: time %d not after the epoch", m.UnixNanos)
	}
	if len(m.Entropy) == 0 || len(m.Entropy) > MaxSyncEntropy {
		return SyncMessage{}, fmt.Errorf("sync: %d bytes of entropy, want 1 to %d", len(m.Entropy), MaxSyncEntropy)
	}
	if m.Identity != nil {
		if err := m.Identity.Check(); err != nil {
			return SyncMessage{}, fmt.Errorf("sync: %w", err)
		}
	}
	if m.Egress != nil {
		if err := m.Egress.Check(); err != nil {
			return SyncMessage{}, fmt.Errorf("sync: %w", err)
		}
	}
	return m, nil
}
