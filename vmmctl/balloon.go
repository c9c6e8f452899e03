package vmmctl

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// The memory balloon of a VM (`warren run --balloon`; a restore keeps the
// snapshot's): GET /v1/balloon answers its state, PUT /v1/balloon changes
// its target and how often the guest is asked for statistics, and answers
// the same. A VM without a balloon answers 404.

// BalloonRequest is PUT /v1/balloon: what to change; an absent field is
// left as it is.
type BalloonRequest struct {
	// TargetMiB is how much of the guest's memory the balloon should hold
	// (taken from the guest and freed on the host), in MiB: 0 gives it
	// all back, at most the guest's memory. The guest's driver moves
	// towards it at its own pace (ActualMiB).
	TargetMiB *uint64 `json:"target_mib,omitempty"`
	// StatsIntervalS is how often, in seconds, the guest is asked for new
	// memory statistics: 0 never (only the set its driver sends when it
	// starts), at most 86400.
	StatsIntervalS *uint64 `json:"stats_interval_s,omitempty"`
}

// BalloonReply is the answer of GET and PUT /v1/balloon.
type BalloonReply struct {
	// TargetMiB and TargetPages are the host's target (4 KiB pages);
	// ActualMiB and ActualPages what the guest's driver says the balloon
	// holds.
	TargetMiB   uint64 `json:"target_mib"`
	TargetPages uint32 `json:"target_pages"`
	ActualMiB   uint64 `json:"actual_mib"`
	ActualPages uint32 `json:"actual_pages"`
	// Active: the guest's driver runs the device; FreePageReporting and
	// StatsQueue: it negotiated those features.
	Active            bool `json:"active"`
	FreePageReporting bool `json:"free_page_reporting"`
	StatsQueue        bool `json:"stats_queue"`
	// StatsIntervalS is how often statistics are asked for (0: never);
	// Stats the latest set, which came at StatsTime (absent: none yet).
	StatsIntervalS float64       `json:"stats_interval_s"`
	Stats          []BalloonStat `json:"stats"`
	StatsTime      time.Time     `json:"stats_time,omitzero"`
	// Counters count what the device did since the VM was first booted
	// (snapshots carry them, except Errors and DiscardErrors).
	Counters BalloonCounters `json:"counters"`
}

// BalloonStat is one memory statistic of the guest (virtio 1.2, 5.5.6.3):
// its tag, its name when known ("free-memory", "available-memory", ...;
// memory amounts in bytes) and its value.
type BalloonStat struct {
	Tag   uint16 `json:"tag"`
	Name  string `json:"name,omitempty"`
	Value uint64 `json:"value"`
}

// BalloonCounters are the balloon device's counters.
type BalloonCounters struct {
	// InflatedPages and DeflatedPages: 4 KiB pages the guest put in and
	// took out of the balloon; InflateDiscardedPages: those the host
	// freed.
	InflatedPages         uint64 `json:"inflated_pages"`
	DeflatedPages         uint64 `json:"deflated_pages"`
	InflateDiscardedPages uint64 `json:"inflate_discarded_pages"`
	// Reports: free page reports; ReportedBytes the free memory they
	// named, ReportDiscardedBytes what the host freed of it.
	Reports              uint64 `json:"reports"`
	ReportedBytes        uint64 `json:"reported_bytes"`
	ReportDiscardedBytes uint64 `json:"report_discarded_bytes"`
	// StatsUpdates: statistics sets received.
	StatsUpdates uint64 `json:"stats_updates"`
	// Errors: guest driver faults (the device then needs a reset);
	// DiscardErrors: discards the host refused.
	Errors        uint64 `json:"errors"`
	DiscardErrors uint64 `json:"discard_errors"`
}

// Balloon answers the VM's balloon state.
func (c Client) Balloon(ctx context.Context) (*BalloonReply, error) {
	var r BalloonReply
	if err := c.Do(ctx, http.MethodGet, "balloon", nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// SetBalloon changes the balloon's target and statistics interval as req
// says and answers as Balloon.
func (c Client) SetBalloon(ctx context.Context, req BalloonRequest) (*BalloonReply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var r BalloonReply
	if err := c.Do(ctx, http.MethodPut, "balloon", b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// SetBalloonTarget sets the balloon's target to mib MiB.
func (c Client) SetBalloonTarget(ctx context.Context, mib uint64) (*BalloonReply, error) {
	return c.SetBalloon(ctx, BalloonRequest{TargetMiB: &mib})
}
