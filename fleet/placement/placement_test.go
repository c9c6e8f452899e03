package placement

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func hosts() []Host {
	return []Host{
		{Name: "a", CPUGroup: "g1", Ready: true, MemoryMiB: 4096, CPUs: 4, CommittedMemoryMiB: 3072, CommittedCPUs: 1},
		{Name: "b", CPUGroup: "g1", Ready: true, MemoryMiB: 4096, CPUs: 4, CommittedMemoryMiB: 512, CommittedCPUs: 1},
		{Name: "c", CPUGroup: "g2", Ready: true, MemoryMiB: 8192, CPUs: 8},
		{Name: "d", CPUGroup: "g1", Ready: false, MemoryMiB: 65536, CPUs: 64},
	}
}

func TestChooseAllSampled(t *testing.T) {
	d, err := Choose(hosts(), Request{MemoryMiB: 256, CPUs: 1}, 0, nil)
	if err != nil || d.Host != "c" || d.Candidates != 3 || d.Sampled != 3 {
		t.Fatalf("got %+v, %v; want c of 3", d, err)
	}
}

func TestChooseGroupAndExclude(t *testing.T) {
	d, err := Choose(hosts(), Request{MemoryMiB: 256, CPUs: 1, CPUGroup: "g1"}, 0, nil)
	if err != nil || d.Host != "b" {
		t.Fatalf("group g1: got %+v, %v; want b", d, err)
	}
	d, err = Choose(hosts(), Request{MemoryMiB: 256, CPUs: 1, CPUGroup: "g1", Exclude: []string{"b"}}, 0, nil)
	if err != nil || d.Host != "a" {
		t.Fatalf("group g1 without b: got %+v, %v; want a", d, err)
	}
	_, err = Choose(hosts(), Request{MemoryMiB: 2048, CPUs: 1, CPUGroup: "g1", Exclude: []string{"b"}}, 0, nil)
	if !errors.Is(err, ErrNoHost) {
		t.Fatalf("a is full: got %v, want ErrNoHost", err)
	}
	t.Log(err)
}

func TestChooseFull(t *testing.T) {
	_, err := Choose(hosts(), Request{MemoryMiB: 16384, CPUs: 1}, 2, nil)
	if !errors.Is(err, ErrNoHost) {
		t.Fatalf("got %v, want ErrNoHost", err)
	}
}

// TestBestOfKSpreads: with k=2 over many equal hosts, repeated placements
// that count what they placed spread evenly instead of piling on one.
func TestBestOfKSpreads(t *testing.T) {
	var hs []Host
	for i := range 50 {
		hs = append(hs, Host{Name: string(rune('A' + i)), Ready: true, MemoryMiB: 64 << 10, CPUs: 64})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		d, err := Choose(hs, Request{MemoryMiB: 256, CPUs: 1}, 2, rng)
		if err != nil {
			t.Fatal(err)
		}
		for i := range hs {
			if hs[i].Name == d.Host {
				hs[i].CommittedMemoryMiB += 256
				hs[i].CommittedCPUs++
			}
		}
	}
	lo, hi := 1<<30, 0
	for _, h := range hs {
		lo, hi = min(lo, h.CommittedCPUs), max(hi, h.CommittedCPUs)
	}
	if hi-lo > 8 {
		t.Fatalf("1000 sandboxes over 50 hosts: per-host counts from %d to %d; best-of-2 should keep them within 8", lo, hi)
	}
}
