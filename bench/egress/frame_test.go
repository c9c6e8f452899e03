package main

import (
	"testing"

	"github.com/warrenvm/warren/ebpf/policy"
)

func TestProbePayload(t *testing.T) {
	for _, size := range []int{0, 16, 17, 64, 1400} {
		payload := probePayload(nil, 123456789, size)
		if want := max(size, minPayload); len(payload) != want {
			t.Fatalf("payload of %d bytes, want %d", len(payload), want)
		}
		if seq, ok := probeSeq(payload); !ok || seq != 123456789 {
			t.Errorf("seq %d %v", seq, ok)
		}
	}
	if _, ok := probeSeq([]byte("not a probe payload")); ok {
		t.Error("probeSeq accepted a foreign payload")
	}
}

func TestBenchPolicy(t *testing.T) {
	rules := benchPolicy()
	if len(rules) != policyRules {
		t.Fatalf("%d rules, want %d", len(rules), policyRules)
	}
	bits := map[int]bool{}
	for _, r := range rules {
		bits[r.CIDR.Bits()] = true
	}
	if len(bits) < 10 {
		t.Errorf("only %d distinct prefix lengths", len(bits))
	}
	table, err := policy.Compile(rules, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := policy.Lookup(table, echoIP, policy.ProtoUDP, echoPort); !ok || r.RuleID != 1 {
		t.Errorf("the echo server is allowed by %+v, %v; want rule 1", r, ok)
	}
	if _, ok := policy.Lookup(table, echoIP, policy.ProtoUDP, echoPort+1); ok {
		t.Error("the echo server's other ports are allowed")
	}
}
