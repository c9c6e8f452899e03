package agentwire

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseSyncMessage(t *testing.T) {
	good := NewSyncMessage(time.Unix(1700000000, 5))
	big := SyncMessage{UnixNanos: 1, Entropy: make([]byte, MaxSyncEntropy+1)}
	bigLine, _ := json.Marshal(big)
	for _, tt := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"good", string(good.MarshalLine()), true},
		{"no newline", strings.TrimSpace(string(good.MarshalLine())), true},
		{"empty", "", false},
		{"not json", "hello\n", false},
		{"zero time", `{"unix_nanos":0,"entropy":"AAAA"}`, false},
		{"negative time", `{"unix_nanos":-5,"entropy":"AAAA"}`, false},
		{"no entropy", `{"unix_nanos":5}`, false},
		{"empty entropy", `{"unix_nanos":5,"entropy":""}`, false},
		{"bad base64", `{"unix_nanos":5,"entropy":"!!"}`, false},
		{"too much entropy", string(bigLine), false},
		{"unknown field", `{"unix_nanos":5,"entropy":"AAAA","x":1}`, false},
		{"trailing", `{"unix_nanos":5,"entropy":"AAAA"} {}`, false},
		{"too long", `{"unix_nanos":5,"entropy":"AAAA"}` + strings.Repeat(" ", MaxSyncLine), false},
	} {
		m, err := ParseSyncMessage([]byte(tt.in))
		if (err == nil) != tt.ok {
			t.Errorf("%s: err %v, want ok=%v", tt.name, err, tt.ok)
		}
		if tt.name == "good" && (m.UnixNanos != good.UnixNanos || !bytes.Equal(m.Entropy, good.Entropy)) {
			t.Errorf("good: got %+v want %+v", m, good)
		}
	}
}

func FuzzParseSyncMessage(f *testing.F) {
	f.Add(NewSyncMessage(time.Unix(1, 0)).MarshalLine())
	f.Add([]byte(`{"unix_nanos":5,"entropy":"AAAA"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseSyncMessage(b)
		if err != nil {
			return
		}
		if m.UnixNanos <= 0 || len(m.Entropy) == 0 || len(m.Entropy) > MaxSyncEntropy {
			t.Fatalf("accepted %+v", m)
		}
	})
}

func TestIdentityCheck(t *testing.T) {
	good := []Identity{
		{},
		{Hostname: "child-3.sandbox", MachineID: NewMachineID(), MAC: "02:00:00:00:00:01"},
	}
	for _, id := range good {
		if err := id.Check(); err != nil {
			t.Errorf("%+v: %v", id, err)
		}
	}
	bad := []Identity{
		{Hostname: strings.Repeat("h", 65)},
		{Hostname: "a b"},
		{Hostname: "x/y"},
		{MachineID: "1234"},
		{MachineID: strings.Repeat("G", 32)},
		{MachineID: strings.Repeat("A", 32)},
		{MAC: "02:00:00:00:00"},
		{MAC: "00:00:00:00:00:00:00:01"},
	}
	for _, id := range bad {
		if err := id.Check(); err == nil {
			t.Errorf("%+v accepted", id)
		}
	}
	a, b := NewMachineID(), NewMachineID()
	if a == b || len(a) != 32 || a[12] != '4' {
		t.Errorf("machine ids %q %q", a, b)
	}
	// A line with a bad identity is refused as a whole.
	m := NewSyncMessage(time.Now())
	m.Identity = &Identity{Hostname: "bad host"}
	if _, err := ParseSyncMessage(m.MarshalLine()); err == nil {
		t.Error("a sync line with a bad identity was accepted")
	}
}

func TestEgressCheck(t *testing.T) {
	// A self-signed CA certificate (openssl req -x509 -newkey ec); Check
	// parses certificates and does not look at their dates.
	ca, err := os.ReadFile("testdata/ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	good := &Egress{TrustPEM: string(ca), Env: map[string]string{"API_KEY": "warren-placeholder-API_KEY"}}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	bad := []*Egress{
		{TrustPEM: "not pem"},
		{TrustPEM: string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}))},
		{TrustPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2}}))},
		{Env: map[string]string{"1X": "v"}},
		{Env: map[string]string{"A=B": "v"}},
		{Env: map[string]string{"A": "v\x00"}},
		{Env: map[string]string{"A": strings.Repeat("v", MaxEnvValue+1)}},
	}
	for i, e := range bad {
		if err := e.Check(); err == nil {
			t.Errorf("case %d accepted", i)
		}
	}
	// A message carrying a bad egress is refused as a whole.
	m := NewSyncMessage(time.Now())
	m.Egress = &Egress{Env: map[string]string{"bad name": "x"}}
	if _, err := ParseSyncMessage(m.MarshalLine()); err == nil {
		t.Error("a sync line with a bad egress parsed")
	}
	m.Egress = good
	got, err := ParseSyncMessage(m.MarshalLine())
	if err != nil || got.Egress.TrustPEM != good.TrustPEM {
		t.Fatalf("round trip: %v", err)
	}
}
