// Package layout states the repository's shape and checks it: which
// top-level folder (a group) may import which (Allowed), and the test
// beside it fails when a package imports against that direction, when a
// package is missing from README.md's layout table, or when a top-level
// folder's doc.go does not say what it may import.
//
// The direction: hostd (the daemon) → the VMM process (its control
// contract in vmmctl; the process itself still inside cmd/warren/cli:
// issue 17) → cow, memsnap, ebpf, image → vmm, devices → vmm/kvm; internal is importable by all and imports none of the others;
// guest code (guestinit) imports no host code. The exceptions, each a
// package that belongs elsewhere, are listed in Exceptions with why.
package layout

import "strings"

// Module is the module path.
const Module = "github.com/warrenvm/warren"

// ranks orders the host groups: a package may import its own group, a
// group of a lower rank, or one of the same rank (cow and memsnap use each
// other's types). cmd and bench drive everything; nothing imports them.
var ranks = map[string]int{
	"vmm/kvm": 0,
	"vmm":     1, "devices": 1,
	"cow": 2, "memsnap": 2, "ebpf": 2, "image": 2,
	"vmmctl": 3,
	"hostd":  4,
	"cmd":    5, "bench": 5,
}

// Exceptions are imports of guest packages by host code that the rules
// refuse, each allowed for the reason given, until it moves.
var Exceptions = map[string]string{
	"guestinit/agent":       "the agent's wire protocol and host-side client still live beside the guest's server (issue 17, item 3)",
	"guestinit/imageconfig": "the contract between the host's image builder and the guest's PID 1: a format both sides read",
}

// Group is the top-level folder a package (its path below the module)
// belongs to; vmm/kvm is a group of its own.
func Group(pkg string) string {
	if pkg == "vmm/kvm" || strings.HasPrefix(pkg, "vmm/kvm/") {
		return "vmm/kvm"
	}
	g, _, _ := strings.Cut(pkg, "/")
	return g
}

// Allowed reports whether package from may import package to (both paths
// below the module), and if not, why.
func Allowed(from, to string) (bool, string) {
	gf, gt := Group(from), Group(to)
	if gf == gt {
		return true, ""
	}
	switch {
	case gt == "internal":
		return true, ""
	case gf == "internal":
		return false, "internal imports nothing of the other groups"
	case gf == "guestinit":
		return false, "guest code imports no host code"
	case gt == "guestinit":
		if _, ok := Exceptions[to]; ok {
			return true, ""
		}
		return false, "host code imports no guest code"
	case gt == "cmd" || gt == "bench":
		return false, gt + " is a leaf: nothing imports it"
	}
	rf, okf := ranks[gf]
	rt, okt := ranks[gt]
	if !okf || !okt {
		return false, "a group without a rank in internal/layout: give it one"
	}
	if rt > rf {
		return false, gf + " is below " + gt + " (hostd → VMM process → cow/memsnap/ebpf/image → vmm/devices → vmm/kvm)"
	}
	return true, ""
}
