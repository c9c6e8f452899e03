// Package layout states the repository's shape and checks it: which
// top-level folder (a group) may import which (Allowed), and the test
// beside it fails when a package imports against that direction, when a
// package is missing from README.md's layout table, or when a top-level
// folder's doc.go does not say what it may import.
//
// The direction: hostd (the daemon) → the VMM process (vmmproc: the
// process itself, its jail and its egress services; its control
// contract in vmmctl; the host's end of the guest agent in agentclient) → cow, memsnap, ebpf, image →
// vmm, devices → vmm/kvm; internal is
// importable by all and imports none of the others; guest code
// (guestinit) imports no host code. A contract both sides of the guest
// boundary read (Contracts: agentwire) is importable by host and guest
// code alike and imports nothing of the module but internal. The
// exceptions, each a guest package that host code may import, are listed
// in Exceptions with why.
package layout

import "strings"

// Module is the module path.
const Module = "github.com/warrenvm/warren"

// ranks orders the host groups: a package may import its own group, a
// group of a lower rank, or one of the same rank (cow and memsnap use each
// other's types). vmmproc (the code that runs in the VMM process) ranks
// with vmmctl, its control contract, so that hostd may import it and it
// never hostd. agentclient ranks with them, in the VMM process's layer: the VMM process serves the guest's re-sync connections with it,
// and the daemon, the CLI and the benchmarks above call the agent through
// it. fleet (the fleet's API types, controller, placement and object
// store) ranks with hostd: the host agent (hostd/kube) reconciles the
// fleet's kinds through the daemon, and the fleet's object store seals
// with hostd/crypt's keys. mcpserver, a client of the daemon's API as the CLI is, ranks with
// cmd, which wires it. cmd and bench drive everything; nothing imports
// them.
var ranks = map[string]int{
	"vmm/kvm": 0,
	"vmm":     1, "devices": 1,
	"cow": 2, "memsnap": 2, "ebpf": 2, "image": 2,
	"vmmctl": 3, "agentclient": 3, "vmmproc": 3,
	"hostd": 4, "fleet": 4,
	"mcpserver": 5,
	"cmd":       5, "bench": 5,
}

// Contracts are the groups that hold a format both sides of the guest
// boundary read: types, constants and pure encode and decode, no
// process's logic. Guest code and host code may import them, and they
// import nothing of the module but internal, so that neither side's code
// reaches the other through them.
var Contracts = map[string]string{
	"agentwire": "the guest agent's wire contract: its HTTP API and the clock/RNG re-sync messages, spoken by the guest's server (guestinit/agent) and the host's end (agentclient)",
}

// Exceptions are imports of guest packages by host code that the rules
// refuse, each allowed for the reason given, until it moves.
var Exceptions = map[string]string{
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
	case Contracts[gf] != "":
		return false, gf + " is a contract both sides read: it imports nothing of the module but internal"
	case Contracts[gt] != "":
		return true, ""
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
