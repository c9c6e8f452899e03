package vmsnap

import (
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
)

// testFP is the fingerprint the KVM-free tests write and restore with.
var testFP = Fingerprint{Profile: hostprofile.Hardware, CPUID: CPUIDHash([]kvm.CPUIDEntry{{Function: 1, EAX: 0x800f12}})}.Encode()

// hostIs returns a FingerprintSource that answers fp.
func hostIs(fp []byte) FingerprintSource { return func() ([]byte, error) { return fp, nil } }

// fakeState is a valid machine state for memBytes of RAM and the named
// virtio devices, with recognisable registers.
func fakeState(memBytes uint64, virtio ...string) *vmm.State {
	st := &vmm.State{
		Version: vmm.StateVersion,
		Machine: vmm.MachineState{MemBytes: memBytes, CPUs: 1, Cmdline: vmm.BaseCmdline,
			Profile: hostprofile.Profile{Kind: hostprofile.Hardware, Module: "kvm_amd"}, Virtio: virtio},
		PICMaster: bytes.Repeat([]byte{1}, 512),
		PICSlave:  bytes.Repeat([]byte{2}, 512),
		IOAPIC:    bytes.Repeat([]byte{3}, 512),
	}
	st.VCPUs = []vmm.VCPUState{{
		CPUID: []kvm.CPUIDEntry{{Function: 0, EAX: 0xd}},
		Regs:  kvm.Regs{RAX: 42, RIP: 0x100000, RFLAGS: 2},
		LAPIC: bytes.Repeat([]byte{7}, 1024),
	}}
	return st
}

// fakeDevices returns transport states for the named devices.
func fakeDevices(names ...string) []DeviceState {
	var ds []DeviceState
	for i, n := range names {
		ds = append(ds, DeviceState{Name: n, State: virtio.TransportState{Version: virtio.StateVersion, DeviceType: uint32(i + 1),
			Queues: []virtio.QueueState{{MaxSize: 256}}}})
	}
	return ds
}

// randomImage returns size bytes of RAM whose listed pages hold
// pseudo-random data tagged with gen (page p starts with p and gen).
func randomImage(size uint64, gen uint64, pages []uint64) []byte {
	img := make([]byte, size)
	r := rand.New(rand.NewPCG(gen, 7))
	for _, p := range pages {
		pg := img[p*pageSize : (p+1)*pageSize]
		for i := 0; i < len(pg); i += 8 {
			binary.LittleEndian.PutUint64(pg[i:], r.Uint64())
		}
		binary.LittleEndian.PutUint64(pg, p)
		binary.LittleEndian.PutUint64(pg[8:], gen)
	}
	return img
}

// bitmap returns a page bitmap of memBytes with pages set.
func bitmap(memBytes uint64, pages []uint64) []uint64 {
	bm := make([]uint64, (memBytes/pageSize+63)/64)
	for _, p := range pages {
		bm[p/64] |= 1 << (p % 64)
	}
	return bm
}

// readAll returns the snapshot's effective memory.
func readAll(t *testing.T, s *Snapshot) []byte {
	t.Helper()
	b := make([]byte, s.Chain.MemSize())
	if _, err := s.Chain.Reader().ReadAt(b, 0); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return b
}

// copyDir copies the regular files of src into a new temporary directory.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}
