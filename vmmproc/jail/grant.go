//go:build linux && amd64

package jail

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/warrenvm/warren/internal/ident"
	"github.com/warrenvm/warren/internal/strictjson"
)

// Grants: what lets a family's helper start a fork child (Spawner). A VMM
// cannot name the uid its children run as or the cgroup they are born in:
// it is confined, maybe subverted, and the helper is root. warren-hostd,
// which allocated both for the child, writes them in a Grant and signs it
// with the family's key (FamilyKey: an HMAC key the daemon derives from
// its own secret and the family's name, and hands to the family's
// jail-init, never to a VMM); the VMM passes the signed grant on, opaque,
// with its fork request. The helper starts a child only under a grant
// whose signature is the family's, that has not expired, and that it has
// not used before (GrantBook): a VMM can neither forge, widen nor replay
// one.

// Grant is what one fork child may be.
type Grant struct {
	// UID and GID the child runs as (never 0), with these supplementary
	// groups.
	UID    int   `json:"uid"`
	GID    int   `json:"gid"`
	Groups []int `json:"groups,omitempty"`
	// Cgroup, when set, is the name of the child's cgroup under each of
	// the helper's cgroup roots: the child is in it before it runs.
	Cgroup string `json:"cgroup,omitempty"`
	// BPF keeps CAP_BPF for the child (a network child's egress maps
	// where BPFNeedsCap), and no other capability.
	BPF bool `json:"bpf,omitempty"`
	// Nonce makes each grant single-use; Expires (Unix seconds) bounds
	// how long the helper must remember it.
	Nonce   string `json:"nonce"`
	Expires int64  `json:"expires"`
}

const (
	// GrantTTL is how long a grant signed by NewGrant stays valid: the
	// fork it is for starts its children within it.
	GrantTTL = 5 * time.Minute
	// maxGrant bounds a signed grant's length.
	maxGrant = 4 << 10
	// maxGroups bounds a grant's supplementary groups.
	maxGroups = 64
)

// FamilyKey derives a family's grant key from the daemon's secret and the
// family's name (any string that names it for the daemon's life and
// after its restarts: its run directory).
func FamilyKey(secret []byte, family string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("warren fork grant key\x00"))
	m.Write([]byte(family))
	return m.Sum(nil)
}

// NewGrant fills in a fresh nonce and an expiry GrantTTL from now, and
// signs g with key.
func NewGrant(key []byte, g Grant) (string, error) {
	var n [16]byte
	if _, err := rand.Read(n[:]); err != nil {
		return "", err
	}
	g.Nonce, g.Expires = hex.EncodeToString(n[:]), time.Now().Add(GrantTTL).Unix()
	return SignGrant(key, g)
}

// SignGrant returns g signed with key: base64url(JSON) "." base64url(MAC).
func SignGrant(key []byte, g Grant) (string, error) {
	if err := g.check(); err != nil {
		return "", err
	}
	b, err := json.Marshal(g)
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	return enc.EncodeToString(b) + "." + enc.EncodeToString(grantMAC(key, b)), nil
}

func grantMAC(key, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return m.Sum(nil)
}

// check refuses a grant no child may have.
func (g *Grant) check() error {
	switch {
	case g.UID <= 0 || g.GID <= 0 || g.UID > 1<<31-2 || g.GID > 1<<31-2:
		return fmt.Errorf("grant: uid %d, gid %d: want neither root nor out of range", g.UID, g.GID)
	case len(g.Groups) > maxGroups:
		return fmt.Errorf("grant: %d groups, at most %d", len(g.Groups), maxGroups)
	// A cgroup: one path component, as the daemon names sandboxes' groups.
	case g.Cgroup != "" && (!ident.Name(g.Cgroup, 128) || g.Cgroup == "." || g.Cgroup == ".."):
		return fmt.Errorf("grant: cgroup %q is not a plain name", g.Cgroup)
	case len(g.Nonce) < 16:
		return errors.New("grant: no nonce")
	}
	for _, gr := range g.Groups {
		if gr <= 0 || gr > 1<<31-2 {
			return fmt.Errorf("grant: group %d: want neither root's nor out of range", gr)
		}
	}
	return nil
}

// GrantBook checks signed grants for one family's helper and remembers
// the nonces of those it accepted until they expire. Its methods may be
// called from several goroutines: mu guards used.
type GrantBook struct {
	key []byte
	mu  sync.Mutex
	// used maps an accepted grant's nonce to its expiry (Unix seconds).
	used map[string]int64
}

// NewGrantBook returns a book for grants signed with key.
func NewGrantBook(key []byte) *GrantBook {
	return &GrantBook{key: bytes.Clone(key), used: map[string]int64{}}
}

// Use checks signed, a grant from SignGrant, at now: its signature (the
// book's key), its expiry, its fields, and that no earlier Use accepted
// it; on success the grant is spent.
func (b *GrantBook) Use(signed string, now time.Time) (Grant, error) {
	var g Grant
	if len(signed) > maxGrant {
		return g, fmt.Errorf("grant: %d bytes, at most %d", len(signed), maxGrant)
	}
	body64, mac64, ok := strings.Cut(signed, ".")
	enc := base64.RawURLEncoding
	body, err1 := enc.DecodeString(body64)
	mac, err2 := enc.DecodeString(mac64)
	if !ok || err1 != nil || err2 != nil {
		return g, errors.New("grant: malformed")
	}
	if !hmac.Equal(mac, grantMAC(b.key, body)) {
		return g, errors.New("grant: not signed by this family's key")
	}
	if err := strictjson.Unmarshal(body, &g); err != nil {
		return Grant{}, fmt.Errorf("grant: %w", err)
	}
	if err := g.check(); err != nil {
		return Grant{}, err
	}
	t := now.Unix()
	if g.Expires < t {
		return Grant{}, fmt.Errorf("grant: expired %s ago", now.Sub(time.Unix(g.Expires, 0)).Round(time.Second))
	}
	if g.Expires > t+int64(2*GrantTTL/time.Second) {
		return Grant{}, errors.New("grant: expires too far ahead")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for n, exp := range b.used {
		if exp < t {
			delete(b.used, n)
		}
	}
	if _, spent := b.used[g.Nonce]; spent {
		return Grant{}, errors.New("grant: already used")
	}
	b.used[g.Nonce] = g.Expires
	return g, nil
}
