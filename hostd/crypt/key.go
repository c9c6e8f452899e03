package crypt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// KeySize is the size of a tenant key's material: AES-256.
const KeySize = 32

// MaxKeyIDLen is the longest key ID a file header can record.
const MaxKeyIDLen = 64

// Provider hands out a tenant's current key. Implementations return an
// error wrapping ErrNoKey when the tenant has none and ErrRevoked (best as
// a *RevokedError) when it was revoked.
type Provider interface {
	Key(ctx context.Context, tenant string) (Key, error)
}

// Sentinel errors; test with errors.Is.
var (
	// ErrNoKey: the tenant has no key (never created).
	ErrNoKey = errors.New("no encryption key")
	// ErrRevoked: the tenant's key was revoked; a *RevokedError says when.
	ErrRevoked = errors.New("encryption key revoked")
	// ErrWrongKey: a file was encrypted under another key than the
	// tenant's current one (another tenant's file, or a key re-created
	// after revocation).
	ErrWrongKey = errors.New("encrypted under a different key")
	// ErrFormat: not an encrypted file of a supported version, or its
	// header is malformed.
	ErrFormat = errors.New("not a valid encrypted file")
	// ErrAuth: the header or a chunk fails authentication, or the file's
	// length matches no valid layout.
	ErrAuth = errors.New("fails authentication")
)

// RevokedError is the error a Provider returns for a revoked tenant key.
// errors.Is(err, ErrRevoked) holds.
type RevokedError struct {
	Tenant string
	At     time.Time // zero if unknown
}

func (e *RevokedError) Error() string {
	at := "an unknown time"
	if !e.At.IsZero() {
		at = e.At.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("tenant %s: key revoked at %s: its snapshots and disks can no longer be read", e.Tenant, at)
}

// Is makes errors.Is(err, ErrRevoked) true.
func (e *RevokedError) Is(target error) bool { return target == ErrRevoked }

// Key is a tenant's key: a stable ID, recorded in every file it encrypts,
// and KeySize bytes of material. Key's String, GoString, Format, LogValue
// and MarshalJSON print the ID only. The material is reachable only
// through a closure, so that not even the paths that bypass those methods
// (fmt printing a struct that holds a Key in an unexported field, or a
// bad verb, which print with reflection) can show it: reflection cannot
// look inside a func value.
//
// The zero Key is invalid. Copies share the material. Keys are not
// comparable; compare IDs.
type Key struct {
	id string
	m  func() *[KeySize]byte
}

// NewKey makes a Key from an ID and material (copied). An empty id is
// replaced by Fingerprint(material). The ID must be 1..MaxKeyIDLen
// printable ASCII bytes.
func NewKey(id string, material []byte) (Key, error) {
	if len(material) != KeySize {
		return Key{}, fmt.Errorf("crypt: key material is %d bytes, want %d", len(material), KeySize)
	}
	if id == "" {
		id = Fingerprint(material)
	}
	if err := checkKeyID(id); err != nil {
		return Key{}, err
	}
	m := new([KeySize]byte)
	copy(m[:], material)
	return Key{id: id, m: func() *[KeySize]byte { return m }}, nil
}

func checkKeyID(id string) error {
	if len(id) == 0 || len(id) > MaxKeyIDLen {
		return fmt.Errorf("crypt: key ID length %d, want 1..%d", len(id), MaxKeyIDLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return fmt.Errorf("crypt: key ID has a byte 0x%02x outside printable ASCII", id[i])
		}
	}
	return nil
}

// Fingerprint is the default key ID: "wk1-" and the hex of the first 16
// bytes of SHA-256("warren key id v1\x00" || material). It identifies a
// key without revealing anything useful about it.
func Fingerprint(material []byte) string {
	h := sha256.New()
	h.Write([]byte("warren key id v1\x00"))
	h.Write(material)
	return "wk1-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// ID is the key's stable identifier.
func (k Key) ID() string { return k.id }

// Valid reports whether k holds material (is not the zero Key).
func (k Key) Valid() bool { return k.m != nil }

// material is the raw key; package use only.
func (k Key) material() []byte { return k.m()[:] }

const redacted = "REDACTED"

// String prints the ID only.
func (k Key) String() string {
	if !k.Valid() {
		return "crypt.Key(none)"
	}
	return "crypt.Key(" + k.id + ", material " + redacted + ")"
}

// GoString prints the ID only.
func (k Key) GoString() string {
	return fmt.Sprintf("crypt.Key{ID: %q, material: %s}", k.id, redacted)
}

// Format makes every verb (%v, %+v, %#v, %s, %x, %q, ...) print the
// redacted form.
func (k Key) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		fmt.Fprint(f, k.GoString())
		return
	}
	fmt.Fprint(f, k.String())
}

// LogValue makes slog log the ID only.
func (k Key) LogValue() slog.Value {
	return slog.GroupValue(slog.String("id", k.id), slog.String("material", redacted))
}

// MarshalJSON encodes the ID only.
func (k Key) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, `{"id":%q,"material":%q}`, k.id, redacted), nil
}
