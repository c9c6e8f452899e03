package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// egressTally keeps warren_egress_denied_packets_total monotonic although
// each VMM's filter counts from zero (a restore, a resume from disk or a
// rollback starts a new VMM, and deleted sandboxes go): per sandbox it
// remembers the VMM (PID and start time) its last count came from, and
// when the VMM changes or the sandbox goes, that count moves to retired.
type egressTally struct {
	mu      sync.Mutex
	last    map[string]egressSeen
	retired uint64
}

type egressSeen struct {
	pid   int
	start uint64
	n     uint64
}

// EgressDenied asks every running network sandbox's VMM for its filter's
// denied-packet count (in parallel, each within a second; one that does
// not answer keeps its last count) and returns the daemon's total: the
// warren_egress_denied_packets_total counter.
func (d *Daemon) EgressDenied() float64 {
	t := &d.egressTally
	var recs []store.Sandbox
	live := map[string]bool{}
	for _, s := range d.allSandboxes() {
		rec := d.snapshotRec(s)
		if !rec.Network {
			continue
		}
		live[rec.ID] = true
		if rec.Status == store.Running || rec.Status == store.Paused {
			recs = append(recs, rec)
		}
	}
	counts := make([]*uint64, len(recs))
	var wg sync.WaitGroup
	for i, rec := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var rep wire.EgressReply
			if vmmCall(ctx, rec.API, http.MethodGet, "egress", nil, &rep) != nil {
				return
			}
			var st struct {
				Filter struct{ DeniedPackets uint64 }
			}
			if json.Unmarshal(rep.Stats, &st) == nil {
				counts[i] = &st.Filter.DeniedPackets
			}
		}()
	}
	wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[string]egressSeen{}
	}
	for i, rec := range recs {
		if counts[i] == nil {
			continue
		}
		prev, ok := t.last[rec.ID]
		if ok && (prev.pid != rec.PID || prev.start != rec.StartTime) {
			t.retired += prev.n
		}
		t.last[rec.ID] = egressSeen{pid: rec.PID, start: rec.StartTime, n: *counts[i]}
	}
	for id, seen := range t.last {
		if !live[id] {
			t.retired += seen.n
			delete(t.last, id)
		}
	}
	total := t.retired
	for _, seen := range t.last {
		total += seen.n
	}
	return float64(total)
}
