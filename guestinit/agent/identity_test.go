package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/warrenvm/warren/agentwire"
)

// TestApplyIdentityMachineID writes the machine id (the part that needs no
// privileges beyond a writable file).
func TestApplyIdentityMachineID(t *testing.T) {
	old := MachineIDPath
	MachineIDPath = filepath.Join(t.TempDir(), "etc", "machine-id") // etc/ made on demand
	defer func() { MachineIDPath = old }()
	id := agentwire.NewMachineID()
	if err := ApplyIdentity(&agentwire.Identity{MachineID: id}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(MachineIDPath)
	if err != nil || string(b) != id+"\n" {
		t.Fatalf("machine-id %q, %v", b, err)
	}
}
