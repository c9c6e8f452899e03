package dnsgate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/warrenvm/warren/ebpf/policy"
)

// key identifies an allow-table entry: one address allowed by one domain.
type key struct {
	addr netip.Addr
	id   uint32
}

// entry is what the table holds for a key.
type entry struct {
	rule    policy.PortRule
	domain  string // the domain's pattern when the entry was added
	expires time.Time
}

// Entry is an allow-table entry as Entries reports it.
type Entry struct {
	Addr    netip.Addr
	Rule    policy.PortRule
	Domain  string // the policy domain's name ("*.example.com")
	Expires time.Time
}

// grant is one address an answer allows.
type grant struct {
	addr netip.Addr
	ttl  time.Duration // already clamped
}

// errTableFull is returned by add when the table has no room.
var errTableFull = errors.New("allow table full")

// add records grants for domain d, keeping the latest expiry of each key,
// and then waits until OnChange has seen them. Nothing is added when the
// new keys do not all fit.
func (g *Gate) add(d policy.Domain, rule policy.PortRule, gs []grant) error {
	if len(gs) == 0 {
		return nil
	}
	g.mu.Lock()
	now := g.now()
	fresh := 0
	for _, gr := range gs {
		if _, ok := g.entries[key{gr.addr, d.ID}]; !ok {
			fresh++
		}
	}
	if len(g.entries)+fresh > g.cfg.MaxEntries {
		// Make room from what has expired but not yet been swept.
		g.sweepLocked(now)
		fresh = 0
		for _, gr := range gs {
			if _, ok := g.entries[key{gr.addr, d.ID}]; !ok {
				fresh++
			}
		}
		if len(g.entries)+fresh > g.cfg.MaxEntries {
			g.mu.Unlock()
			g.sync()
			return errTableFull
		}
	}
	for _, gr := range gs {
		k := key{gr.addr, d.ID}
		exp := now.Add(gr.ttl)
		if e, ok := g.entries[k]; ok {
			if exp.After(e.expires) {
				e.expires = exp
			}
			e.rule, e.domain = rule, d.Name
			continue
		}
		g.entries[k] = &entry{rule: rule, domain: d.Name, expires: exp}
		g.gen++
	}
	g.scheduleLocked(now)
	g.mu.Unlock()
	g.sync()
	return nil
}

// sync calls OnChange with the current set unless the last call already
// reflected every change made so far. When it returns, every change made
// before it was called has been seen by OnChange.
func (g *Gate) sync() {
	g.changeMu.Lock()
	defer g.changeMu.Unlock()
	g.mu.Lock()
	gen := g.gen
	if gen == g.notified {
		g.mu.Unlock()
		return
	}
	hosts := g.hostsLocked()
	g.mu.Unlock()
	if g.cfg.OnChange != nil {
		g.cfg.OnChange(hosts)
	}
	g.notified = gen
}

// sweepLocked removes the entries expired at now and reports whether any
// was.
func (g *Gate) sweepLocked(now time.Time) bool {
	removed := false
	for k, e := range g.entries {
		if !e.expires.After(now) {
			delete(g.entries, k)
			removed = true
		}
	}
	if removed {
		g.gen++
	}
	return removed
}

// scheduleLocked sets the expiry timer for the earliest expiry.
func (g *Gate) scheduleLocked(now time.Time) {
	if g.closed {
		return
	}
	var first time.Time
	for _, e := range g.entries {
		if first.IsZero() || e.expires.Before(first) {
			first = e.expires
		}
	}
	if first.IsZero() {
		if g.timer != nil {
			g.timer.Stop()
		}
		return
	}
	d := max(first.Sub(now), 0)
	if g.timer == nil {
		g.timer = time.AfterFunc(d, g.Expire)
	} else {
		g.timer.Reset(d)
	}
}

// Expire removes the entries whose time has passed (by Config.Now) and
// calls OnChange if any was. The gate's timer calls it; tests with a fake
// clock call it after moving the clock.
func (g *Gate) Expire() {
	g.mu.Lock()
	now := g.now()
	g.sweepLocked(now)
	g.scheduleLocked(now)
	g.mu.Unlock()
	g.sync()
}

// Hosts returns the current allow set, sorted by address and rule id.
func (g *Gate) Hosts() []policy.HostRule {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.hostsLocked()
}

func (g *Gate) hostsLocked() []policy.HostRule {
	out := make([]policy.HostRule, 0, len(g.entries))
	for k, e := range g.entries {
		out = append(out, policy.HostRule{Addr: k.addr, Rule: e.rule})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Addr != out[j].Addr {
			return out[i].Addr.Less(out[j].Addr)
		}
		return out[i].Rule.RuleID < out[j].Rule.RuleID
	})
	return out
}

// Entries returns the allow table with expiry times, sorted as Hosts.
func (g *Gate) Entries() []Entry {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Entry, 0, len(g.entries))
	for k, e := range g.entries {
		out = append(out, Entry{Addr: k.addr, Rule: e.rule, Domain: e.domain, Expires: e.expires})
	}
	sortEntries(out)
	return out
}

func sortEntries(es []Entry) {
	sort.Slice(es, func(i, j int) bool {
		if es[i].Addr != es[j].Addr {
			return es[i].Addr.Less(es[j].Addr)
		}
		return es[i].Rule.RuleID < es[j].Rule.RuleID
	})
}

// stillAllowed reports whether p still has the domain that added e, with
// the same id, name and port rule.
func stillAllowed(p policy.Policy, id uint32, e *entry) bool {
	for _, d := range p.Domains {
		if d.ID != id {
			continue
		}
		pr, err := d.PortRule()
		return err == nil && d.Name == e.domain && pr == e.rule
	}
	return false
}

// SetPolicy replaces the policy. Entries of domains that are gone, renamed
// or whose protocol or ports changed are removed at once, and OnChange is
// called before SetPolicy returns.
func (g *Gate) SetPolicy(p policy.Policy) {
	p = clonePolicy(p)
	g.mu.Lock()
	g.pol = p
	removed := false
	for k, e := range g.entries {
		if !stillAllowed(p, k.id, e) {
			delete(g.entries, k)
			removed = true
		}
	}
	if removed {
		g.gen++
	}
	g.scheduleLocked(g.now())
	g.mu.Unlock()
	g.sync()
}

// stateVersion is the version of State's format.
const stateVersion = 1

type stateJSON struct {
	Version int         `json:"version"`
	Entries []entryJSON `json:"entries"`
}

type entryJSON struct {
	Addr    netip.Addr `json:"addr"`
	RuleID  uint32     `json:"rule"`
	Proto   uint8      `json:"proto"`
	Lo      uint16     `json:"lo"`
	Hi      uint16     `json:"hi"`
	Domain  string     `json:"domain"`
	Expires time.Time  `json:"expires"`
}

// State returns the allow table as JSON, with absolute expiry times, for a
// snapshot.
func (g *Gate) State() ([]byte, error) {
	es := g.Entries()
	s := stateJSON{Version: stateVersion, Entries: make([]entryJSON, 0, len(es))}
	for _, e := range es {
		s.Entries = append(s.Entries, entryJSON{Addr: e.Addr, RuleID: e.Rule.RuleID, Proto: e.Rule.Proto,
			Lo: e.Rule.Lo, Hi: e.Rule.Hi, Domain: e.Domain, Expires: e.Expires})
	}
	return json.Marshal(s)
}

// Restore replaces the allow table with one State returned, dropping the
// entries already expired and those the current policy no longer allows
// (so restore under a narrower policy is safe), keeping at most MaxEntries
// (the latest expiries), and calls OnChange.
func (g *Gate) Restore(b []byte) error {
	var s stateJSON
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("dnsgate: restore: %w", err)
	}
	if s.Version != stateVersion {
		return fmt.Errorf("dnsgate: restore: state version %d, want %d", s.Version, stateVersion)
	}
	for i, e := range s.Entries {
		if !e.Addr.IsValid() || e.Lo > e.Hi {
			return fmt.Errorf("dnsgate: restore: entry %d is malformed", i+1)
		}
	}
	// Latest expiries first, so the cap keeps them.
	sort.SliceStable(s.Entries, func(i, j int) bool { return s.Entries[i].Expires.After(s.Entries[j].Expires) })
	g.mu.Lock()
	now := g.now()
	entries := map[key]*entry{}
	for _, e := range s.Entries {
		if !e.Expires.After(now) || len(entries) >= g.cfg.MaxEntries {
			continue
		}
		k := key{e.Addr.Unmap(), e.RuleID}
		if _, dup := entries[k]; dup {
			continue
		}
		en := &entry{rule: policy.PortRule{Proto: e.Proto, Lo: e.Lo, Hi: e.Hi, RuleID: e.RuleID},
			domain: e.Domain, expires: e.Expires}
		if !stillAllowed(g.pol, e.RuleID, en) {
			continue
		}
		entries[k] = en
	}
	g.entries = entries
	g.gen++
	g.scheduleLocked(now)
	g.mu.Unlock()
	g.sync()
	return nil
}
