//go:build linux && amd64

package jail

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// TestGrantBook: a grant signed with the family's key is accepted once;
// a replay, another family's grant, an altered one, an expired one and
// one for root or a path-like cgroup are refused, the way a subverted
// VMM would try them.
func TestGrantBook(t *testing.T) {
	secret := []byte("the daemon's secret")
	key := FamilyKey(secret, "/run/warren/j-sb1")
	book := NewGrantBook(key)
	now := time.Now()
	good := Grant{UID: 100001, GID: 100001, Groups: []int{100000}, Cgroup: "sb-child", Nonce: "0123456789abcdef0123", Expires: now.Add(time.Minute).Unix()}
	signed, err := SignGrant(key, good)
	if err != nil {
		t.Fatal(err)
	}
	g, err := book.Use(signed, now)
	if err != nil || g.UID != good.UID || g.Cgroup != good.Cgroup || len(g.Groups) != 1 {
		t.Fatalf("a good grant: %+v, %v", g, err)
	}
	sign := func(key []byte, g Grant) string {
		s, err := SignGrant(key, g)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	fresh := func(g Grant, nonce string) Grant { g.Nonce = nonce + "-0123456789abcdef"; return g }
	body, mac, _ := strings.Cut(sign(key, fresh(good, "altered")), ".")
	raw, _ := base64.RawURLEncoding.DecodeString(body)
	altered := base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(raw), "100001", "100002", 1))) + "." + mac
	expired := fresh(good, "expired")
	expired.Expires = now.Add(-time.Second).Unix()
	tooLong := fresh(good, "toolong")
	tooLong.Expires = now.Add(time.Hour).Unix()
	for _, c := range []struct{ name, signed, want string }{
		{"replayed", signed, "already used"},
		{"another family's", sign(FamilyKey(secret, "/run/warren/j-sb2"), fresh(good, "other")), "not signed"},
		{"altered", altered, "not signed"},
		{"expired", sign(key, expired), "expired"},
		{"expiring too late", sign(key, tooLong), "too far"},
		{"malformed", "not a grant", "malformed"},
		{"oversized", strings.Repeat("A", maxGrant+1), "at most"},
	} {
		if _, err := book.Use(c.signed, now); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s grant: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	for _, bad := range []Grant{
		{UID: 0, GID: 1, Nonce: "0123456789abcdef"},
		{UID: 1, GID: 0, Nonce: "0123456789abcdef"},
		{UID: 1, GID: 1, Groups: []int{0}, Nonce: "0123456789abcdef"},
		{UID: 1, GID: 1, Cgroup: "../other", Nonce: "0123456789abcdef"},
		{UID: 1, GID: 1, Cgroup: "a/b", Nonce: "0123456789abcdef"},
		{UID: 1, GID: 1},
	} {
		if _, err := SignGrant(key, bad); err == nil {
			t.Errorf("%+v was signed", bad)
		}
	}
	if s, err := NewGrant(key, Grant{UID: 5, GID: 5}); err != nil {
		t.Error(err)
	} else if g, err := book.Use(s, time.Now()); err != nil || g.Expires < time.Now().Add(GrantTTL-time.Minute).Unix() {
		t.Errorf("NewGrant: %+v, %v", g, err)
	}
}

// TestGrantKeyOnReport: the daemon's key reaches jail-init on the report
// socket before anything else; a wrong-sized key is refused on both
// ends, and a missing one ends the wait with an error.
func TestGrantKeyOnReport(t *testing.T) {
	parent, child, err := InitReport()
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	defer child.Close()
	key := FamilyKey([]byte("secret"), "family")
	if err := SendGrantKey(parent, key); err != nil {
		t.Fatal(err)
	}
	got, err := ReceiveGrantKey(int(child.Fd()), time.Second)
	if err != nil || string(got) != string(key) {
		t.Fatalf("received %x, %v; want %x", got, err, key)
	}
	if err := SendGrantKey(parent, []byte("short")); err == nil {
		t.Error("a 5-byte key was sent")
	}
	if _, err := ReceiveGrantKey(int(child.Fd()), 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "no grant key") {
		t.Errorf("no key: %v", err)
	}
	if _, err := ReceiveGrantKey(-1, time.Second); err == nil {
		t.Error("a key from no socket")
	}
}
