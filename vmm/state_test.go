package vmm

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
	"github.com/warrenvm/warren/vmm/serial"
)

// fakeState is a valid state for cpus vCPUs, filled with recognisable values.
func fakeState(cpus int) *State {
	st := &State{
		Version: StateVersion,
		Machine: MachineState{MemBytes: 64 << 20, CPUs: cpus, Cmdline: BaseCmdline + " quiet",
			Profile: hostprofile.Profile{Kind: hostprofile.Hardware, Module: "kvm_amd"}},
		PICMaster: bytes.Repeat([]byte{1}, irqChipSize),
		PICSlave:  bytes.Repeat([]byte{2}, irqChipSize),
		IOAPIC:    bytes.Repeat([]byte{3}, irqChipSize),
		Clock:     kvm.ClockData{Clock: 123456789, Flags: 2, Realtime: 1 << 60},
		UART:      serial.State{IER: 1, LCR: 3, DLL: 1, THRPending: true, RX: []byte("in")},
	}
	st.PIT.Channels[0] = kvm.PITChannelState{Count: 65536, Mode: 2, Gate: 1, CountLoadTime: -5}
	for i := 0; i < cpus; i++ {
		c := VCPUState{
			ID:      i,
			CPUID:   []kvm.CPUIDEntry{{Function: 0, EAX: 0xd}, {Function: 1, EBX: uint32(i) << 24}},
			TSCKHz:  2_000_000,
			MPState: kvm.MPStateRunnable,
			Regs:    kvm.Regs{RAX: 1, RBX: ^uint64(0), RIP: 0x100000 + uint64(i), RFLAGS: 2},
			Xsave:   bytes.Repeat([]byte{0xa5}, 4096),
			XCRs:    &kvm.XCRs{NrXCRs: 1, XCRs: [16]kvm.XCR{{Value: 7}}},
			MSRs:    []MSR{{kvm.MSRIA32TSC, 1 << 40}, {kvm.MSRLSTAR, 0xffffffff81000000}},
			LAPIC:   bytes.Repeat([]byte{byte(i)}, lapicStateSize),
		}
		c.Sregs.CR0, c.Sregs.EFER, c.Sregs.CS.Selector = 0x80050033, 0xd01, 0x10
		c.FPU.FCW, c.FPU.MXCSR = 0x37f, 0x1f80
		c.Events.Exception.Nr, c.Events.Flags = 14, kvm.VCPUEventValidShadow
		c.DebugRegs.DR7 = 0x400
		st.VCPUs = append(st.VCPUs, c)
	}
	return st
}

func TestStateRoundTrip(t *testing.T) {
	st := fakeState(2)
	a, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("Marshal is not deterministic")
	}
	back, err := UnmarshalState(a)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, st) {
		t.Fatalf("round trip changed the state:\n got %+v\nwant %+v", back, st)
	}
	again, _ := back.Marshal()
	if !bytes.Equal(again, a) {
		t.Fatal("re-encoding a decoded state gives other bytes")
	}
}

func TestUnmarshalStateRefuses(t *testing.T) {
	good, err := fakeState(1).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*State){
		"version":       func(s *State) { s.Version = StateVersion + 1 },
		"cpu count":     func(s *State) { s.Machine.CPUs = 2 },
		"no cpus":       func(s *State) { s.Machine.CPUs, s.VCPUs = 0, nil },
		"vcpu id":       func(s *State) { s.VCPUs[0].ID = 3 },
		"lapic size":    func(s *State) { s.VCPUs[0].LAPIC = s.VCPUs[0].LAPIC[:100] },
		"irqchip size":  func(s *State) { s.IOAPIC = nil },
		"xsave size":    func(s *State) { s.VCPUs[0].Xsave = make([]byte, 100) },
		"no cpuid":      func(s *State) { s.VCPUs[0].CPUID = nil },
		"too many msrs": func(s *State) { s.VCPUs[0].MSRs = make([]MSR, maxStateMSRs+1) },
		"mp state":      func(s *State) { s.VCPUs[0].MPState = 99 },
		"cr3 past ram": func(s *State) {
			s.VCPUs[0].Sregs.CR0 |= 1 << 31
			s.VCPUs[0].Sregs.CR3 = s.Machine.MemBytes + 0x1000
		},
		"xcr count":      func(s *State) { s.VCPUs[0].XCRs.NrXCRs = 17 },
		"uart registers": func(s *State) { s.UART.IER = 0xff },
	}
	for name, mod := range cases {
		st := fakeState(1)
		mod(st)
		b, err := st.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		_, err = UnmarshalState(b)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		// Only the paging case says it is the emulated host's signature.
		if errors.Is(err, ErrPagingOutsideRAM) != (name == "cr3 past ram") {
			t.Errorf("%s: %v: errors.Is ErrPagingOutsideRAM %v", name, err, errors.Is(err, ErrPagingOutsideRAM))
		}
	}
	for name, b := range map[string]string{
		"unknown field": strings.Replace(string(good), `"Version"`, `"Extra":1,"Version"`, 1),
		"trailing data": string(good) + "{}",
		"truncated":     string(good[:len(good)/2]),
		"empty":         "",
	} {
		if _, err := UnmarshalState([]byte(b)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestRestoreRefuses checks that Restore turns away a state that does not
// fit the config before creating anything (KVMPath points nowhere, and
// fill must not run).
func TestRestoreRefuses(t *testing.T) {
	profile := hostprofile.Profile{Kind: hostprofile.Hardware, Module: "kvm_amd"}
	base := Config{MemBytes: 64 << 20, CPUs: 1, Profile: profile, KVMPath: "/nonexistent/kvm"}
	cases := []struct {
		name string
		cfg  func(*Config)
		st   func(*State)
		want string
	}{
		{"version", nil, func(s *State) { s.Version = 0 }, "version"},
		{"cpus", func(c *Config) { c.CPUs = 2 }, nil, "vCPUs"},
		{"memory", func(c *Config) { c.MemBytes = 128 << 20 }, nil, "memory"},
		{"virtio", func(c *Config) { c.Virtio = []VirtioSpec{{Name: "blk"}} }, nil, "virtio"},
		{"profile", func(c *Config) { c.Profile.Kind = hostprofile.PVMNative }, nil, "host"},
		{"nil state", nil, nil, "none"},
	}
	for _, c := range cases {
		cfg, st := base, fakeState(1)
		if c.cfg != nil {
			c.cfg(&cfg)
		}
		if c.st != nil {
			c.st(st)
		}
		if c.name == "nil state" {
			st = nil
		}
		filled := false
		vm, err := Restore(cfg, st, func(*guestmem.Memory) error { filled = true; return nil })
		if err == nil {
			vm.Close()
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || filled {
			t.Errorf("%s: err %v (want it to mention %q), fill called %v", c.name, err, c.want, filled)
		}
	}
}

func FuzzUnmarshalState(f *testing.F) {
	good, err := fakeState(1).Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"Version":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := UnmarshalState(b)
		if err != nil {
			return
		}
		// Whatever is accepted must be valid and encode again.
		if err := st.Validate(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Marshal(); err != nil {
			t.Fatal(err)
		}
	})
}
