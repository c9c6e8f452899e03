package agent

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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

// TestSyncServiceIdentity: the service's lines carry the identity set
// last, and the agent side parses it back.
func TestSyncServiceIdentity(t *testing.T) {
	var s SyncService
	read := func() SyncMessage {
		host, guest := net.Pipe()
		go s.Serve(host)
		defer guest.Close()
		line, err := bufio.NewReader(guest).ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		m, err := ParseSyncMessage(line)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := read(); m.Identity != nil {
		t.Fatalf("identity %+v before SetIdentity", m.Identity)
	}
	id := &Identity{Hostname: "child-1", MachineID: NewMachineID()}
	s.SetIdentity(id)
	if m := read(); m.Identity == nil || *m.Identity != *id {
		t.Fatalf("identity %+v, want %+v", m.Identity, id)
	}
}

// TestApplyIdentityMachineID writes the machine id (the part that needs no
// privileges beyond a writable file).
func TestApplyIdentityMachineID(t *testing.T) {
	old := MachineIDPath
	MachineIDPath = filepath.Join(t.TempDir(), "etc", "machine-id") // etc/ made on demand
	defer func() { MachineIDPath = old }()
	id := NewMachineID()
	if err := ApplyIdentity(&Identity{MachineID: id}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(MachineIDPath)
	if err != nil || string(b) != id+"\n" {
		t.Fatalf("machine-id %q, %v", b, err)
	}
}
