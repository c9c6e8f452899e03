package vmmctl

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// snapshotServer answers POST /v1/snapshot, recording each request, and
// refuses the paths in fail.
func snapshotServer(t *testing.T, fail map[string]bool) (Client, func() []SnapshotRequest) {
	var mu sync.Mutex
	var got []SnapshotRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/snapshot", func(w http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		if fail[req.Path] {
			w.WriteHeader(http.StatusConflict)
			json.NewEncoder(w).Encode(ErrorReply{Error: "no room for " + req.Path})
			return
		}
		json.NewEncoder(w).Encode(SnapshotReply{Path: req.Path, Kind: string(req.Kind), Line: "took " + req.Path})
	})
	return serve(t, mux), func() []SnapshotRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]SnapshotRequest(nil), got...)
	}
}

func TestSnapshotEvery(t *testing.T) {
	F, I := vmsnap.Full, vmsnap.Incremental
	for _, tc := range []struct {
		name  string
		s     SnapshotSchedule
		kinds []vmsnap.Kind
	}{
		{"full then a chain of 3", SnapshotSchedule{MaxChain: 3, Count: 7}, []vmsnap.Kind{F, I, I, F, I, I, F}},
		{"over the previous snapshot", SnapshotSchedule{MaxChain: 3, Count: 5, Incremental: true}, []vmsnap.Kind{I, I, F, I, I}},
		{"full ones only", SnapshotSchedule{MaxChain: 1, Count: 3}, []vmsnap.Kind{F, F, F}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, got := snapshotServer(t, nil)
			tc.s.Every = time.Millisecond
			var lines []string
			if err := c.SnapshotEvery(context.Background(), "/s/x", tc.s, func(r *SnapshotReply) { lines = append(lines, r.Line) }); err != nil {
				t.Fatal(err)
			}
			reqs := got()
			if len(reqs) != len(tc.kinds) || len(lines) != len(tc.kinds) {
				t.Fatalf("%d requests, %d replies, want %d", len(reqs), len(lines), len(tc.kinds))
			}
			for i, r := range reqs {
				if want := fmt.Sprintf("/s/x-%04d", i+1); r.Path != want || r.Kind != tc.kinds[i] || lines[i] != "took "+want {
					t.Errorf("snapshot %d: %+v, reply %q, want %s %s", i+1, r, lines[i], want, tc.kinds[i])
				}
			}
		})
	}

	// A refusal ends the schedule with the VMM's error.
	c, got := snapshotServer(t, map[string]bool{"/s/x-0002": true})
	err := c.SnapshotEvery(context.Background(), "/s/x", SnapshotSchedule{Every: time.Millisecond, MaxChain: 8}, func(*SnapshotReply) {})
	if err == nil || !strings.Contains(err.Error(), "no room for /s/x-0002") || len(got()) != 2 {
		t.Errorf("a refused snapshot: %v after %d requests", err, len(got()))
	}

	// Without Count it runs until its context ends, which is no error.
	c, got = snapshotServer(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err = c.SnapshotEvery(ctx, "/s/x", SnapshotSchedule{Every: time.Millisecond, MaxChain: 8}, func(*SnapshotReply) {
		if n++; n == 3 {
			cancel()
		}
	})
	if err != nil || n != 3 || len(got()) != 3 {
		t.Errorf("cancelled: %v after %d snapshots (%d requests)", err, n, len(got()))
	}
}
