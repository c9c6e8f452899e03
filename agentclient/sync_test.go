package agentclient

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// readSync reads the host's line from the guest's end of a re-sync
// connection and parses it as the guest does.
func readSync(t *testing.T, guest net.Conn) agentwire.SyncMessage {
	t.Helper()
	line, err := bufio.NewReader(guest).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	m, err := agentwire.ParseSyncMessage(line)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestServeSync: one line with the time and fresh entropy, then the
// connection stays open until the guest closes it.
func TestServeSync(t *testing.T) {
	host, guest := net.Pipe()
	done := make(chan struct{})
	go func() { ServeSync(host); close(done) }()
	before := time.Now()
	m := readSync(t, guest)
	if got := time.Unix(0, m.UnixNanos); got.Before(before.Add(-time.Second)) || got.After(time.Now().Add(time.Second)) {
		t.Errorf("time %v, now %v", got, before)
	}
	if len(m.Entropy) != agentwire.SyncEntropyBytes || bytes.Equal(m.Entropy, make([]byte, agentwire.SyncEntropyBytes)) {
		t.Errorf("entropy %x", m.Entropy)
	}
	// It keeps the connection open until the guest closes it.
	select {
	case <-done:
		t.Fatal("ServeSync returned with the connection open")
	case <-time.After(50 * time.Millisecond):
	}
	guest.Close()
	<-done
}

// TestSyncServiceIdentity: the service's lines carry the identity set
// last, and the agent side parses it back.
func TestSyncServiceIdentity(t *testing.T) {
	var s SyncService
	read := func() agentwire.SyncMessage {
		host, guest := net.Pipe()
		go s.Serve(host)
		defer guest.Close()
		return readSync(t, guest)
	}
	if m := read(); m.Identity != nil {
		t.Fatalf("identity %+v before SetIdentity", m.Identity)
	}
	id := &agentwire.Identity{Hostname: "child-1", MachineID: agentwire.NewMachineID()}
	s.SetIdentity(id)
	if m := read(); m.Identity == nil || *m.Identity != *id {
		t.Fatalf("identity %+v, want %+v", m.Identity, id)
	}
}
