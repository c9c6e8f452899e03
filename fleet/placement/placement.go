// Package placement chooses a host for a sandbox: best of K random
// feasible hosts, scored by the memory and CPUs they would have left.
//
// It is pure: the caller (fleet/controller) builds the host list from
// its informer caches, counting as committed every sandbox already
// placed on a host, and records the choice.
package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// Host is one candidate as the controller sees it now.
type Host struct {
	Name string
	// CPUGroup is the host's CPU fingerprint group.
	CPUGroup string
	// Ready: its Lease is current and it is not cordoned.
	Ready bool
	// Capacity and Committed (the sum of the resources of the sandboxes
	// placed on it) in MiB and CPUs.
	MemoryMiB, CPUs                   int
	CommittedMemoryMiB, CommittedCPUs int
}

// Request is what one sandbox needs.
type Request struct {
	MemoryMiB, CPUs int
	// CPUGroup, when set, is the only group whose hosts can restore the
	// sandbox (it resumes a snapshot taken on that group).
	CPUGroup string
	// Exclude are hosts that refused it.
	Exclude []string
}

// ErrNoHost: no host can take the request now.
var ErrNoHost = errors.New("no host can take the sandbox")

// Decision is a choice and why.
type Decision struct {
	Host string
	// Candidates is how many hosts were feasible, Sampled how many of
	// them were compared.
	Candidates, Sampled int
}

// String is the event message of a placement.
func (d Decision) String() string {
	return fmt.Sprintf("placed on %s (best of %d sampled among %d feasible hosts)", d.Host, d.Sampled, d.Candidates)
}

// feasible says whether h can take r, and why not.
func feasible(h Host, r Request) (bool, string) {
	switch {
	case !h.Ready:
		return false, "not ready"
	case slices.Contains(r.Exclude, h.Name):
		return false, "refused it before"
	case r.CPUGroup != "" && h.CPUGroup != r.CPUGroup:
		return false, "CPU group " + h.CPUGroup
	case h.CommittedMemoryMiB+r.MemoryMiB > h.MemoryMiB:
		return false, "memory full"
	case h.CommittedCPUs+r.CPUs > h.CPUs:
		return false, "CPUs full"
	}
	return true, ""
}

// score is what h would have left after taking r, as the smaller of its
// free memory and free CPU fractions: higher is better.
func score(h Host, r Request) float64 {
	mem := float64(h.MemoryMiB-h.CommittedMemoryMiB-r.MemoryMiB) / float64(max(h.MemoryMiB, 1))
	cpu := float64(h.CPUs-h.CommittedCPUs-r.CPUs) / float64(max(h.CPUs, 1))
	return min(mem, cpu)
}

// Choose picks the best of k hosts sampled at random among the feasible
// ones (all of them when k <= 0 or there are fewer). rng may be nil.
// With none feasible it returns ErrNoHost wrapped with the reasons.
func Choose(hosts []Host, r Request, k int, rng *rand.Rand) (Decision, error) {
	var ok []Host
	why := map[string]int{}
	for _, h := range hosts {
		if f, reason := feasible(h, r); f {
			ok = append(ok, h)
		} else {
			why[reason]++
		}
	}
	if len(ok) == 0 {
		var parts []string
		for reason, n := range why {
			parts = append(parts, fmt.Sprintf("%d %s", n, reason))
		}
		slices.Sort(parts)
		return Decision{}, fmt.Errorf("%w (%d hosts: %s)", ErrNoHost, len(hosts), strings.Join(parts, ", "))
	}
	if k <= 0 || k > len(ok) {
		k = len(ok)
	}
	perm := func(n int) []int {
		if rng != nil {
			return rng.Perm(n)
		}
		return rand.Perm(n)
	}
	best, bestScore := "", -2.0
	for _, i := range perm(len(ok))[:k] {
		if s := score(ok[i], r); s > bestScore || (s == bestScore && ok[i].Name < best) {
			best, bestScore = ok[i].Name, s
		}
	}
	return Decision{Host: best, Candidates: len(ok), Sampled: k}, nil
}
