package daemon

// A sandbox's memory balloon.
//
// A template built with "balloon": true has a VMM with a virtio-balloon
// device (`warren run --balloon`; devices/virtio/balloon), and so does
// every sandbox restored from its snapshot, or forked from one of them.
// GET /v1/sandboxes/{id}/balloon forwards to the VMM's GET /v1/balloon
// (target, actual, the guest's latest memory statistics, counters); PUT
// sets its target (how much of the guest's memory the balloon takes and
// the host frees) and statistics interval through the VMM's PUT
// /v1/balloon, and records the target on the sandbox
// (Sandbox.BalloonTargetMiB).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/vmmctl"
)

// maxBalloonBody bounds PUT /v1/sandboxes/{id}/balloon's body.
const maxBalloonBody = 4 << 10

// maxBalloonStatsInterval bounds its stats_interval_s (the VMM's bound).
const maxBalloonStatsInterval = 86400

// getBalloon is GET /v1/sandboxes/{id}/balloon: its VMM's balloon state.
func (d *Daemon) getBalloon(w http.ResponseWriter, r *http.Request, s *sbState) {
	rec := d.snapshotRec(s)
	if rec.Status != store.Running && rec.Status != store.Paused {
		writeErr(w, errf(409, "sandbox %s is %s", rec.ID, rec.Status))
		return
	}
	rep, err := vmmctl.Client{Socket: rec.API}.Balloon(r.Context())
	if err != nil {
		writeErr(w, balloonErr(rec.ID, err))
		return
	}
	writeJSON(w, 200, nonNilStats(rep))
}

// putBalloon is PUT /v1/sandboxes/{id}/balloon: a new target (at most
// the guest's memory) and statistics interval for the running sandbox's
// balloon, put in force by its VMM; the target is then recorded on the
// sandbox. The guest's driver follows the target at its own pace
// (actual_mib).
func (d *Daemon) putBalloon(w http.ResponseWriter, r *http.Request, s *sbState) {
	req, err := readBalloonRequest(r.Body)
	if err != nil {
		writeErr(w, err)
		return
	}
	if req.StatsIntervalS != nil && *req.StatsIntervalS > maxBalloonStatsInterval {
		writeErr(w, errf(400, "balloon: stats_interval_s %d: at most %d", *req.StatsIntervalS, maxBalloonStatsInterval))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := running(s, false); err != nil {
		writeErr(w, err)
		return
	}
	if req.TargetMiB != nil {
		if guest := d.guestMemMiB(s.rec); *req.TargetMiB > uint64(guest) {
			writeErr(w, errf(400, "balloon: target %d MiB is more than the sandbox's %d MiB of guest memory", *req.TargetMiB, guest))
			return
		}
	}
	rep, err := vmmctl.Client{Socket: s.rec.API}.SetBalloon(r.Context(), req)
	if err != nil {
		writeErr(w, balloonErr(s.rec.ID, err))
		return
	}
	rep = nonNilStats(rep)
	if req.TargetMiB != nil {
		v := *req.TargetMiB
		s.rec.BalloonTargetMiB = &v // a new value: views share the old one
		if err := d.save(s); err != nil {
			writeErr(w, fmt.Errorf("the target is in force, but recording it on the sandbox failed: %w", err))
			return
		}
	}
	writeJSON(w, 200, rep)
}

// readBalloonRequest reads a PUT's body: one BalloonRequest of at most
// maxBalloonBody bytes, no unknown field, nothing after it (400
// otherwise).
func readBalloonRequest(body io.Reader) (vmmctl.BalloonRequest, error) {
	var req vmmctl.BalloonRequest
	b, err := io.ReadAll(io.LimitReader(body, maxBalloonBody+1))
	if err != nil || len(b) > maxBalloonBody {
		return req, errf(400, "bad request body: want a balloon request of at most %d bytes", maxBalloonBody)
	}
	if isNull(b) {
		return req, errf(400, "balloon: the body must be a JSON object (target_mib, stats_interval_s)")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, errf(400, "bad request body: %v", err)
	}
	if dec.More() {
		return req, errf(400, "bad request body: more than one JSON value")
	}
	return req, nil
}

// guestMemMiB is the guest memory of sandbox rec's VMM: its template's
// (a template is not deleted while a sandbox uses it), else its own
// memory limit, which is at least that (caller holds s.mu or owns rec).
func (d *Daemon) guestMemMiB(rec *store.Sandbox) int {
	if t := d.template(rec.Tenant, rec.Template); t != nil {
		if v := t.view.Load(); v != nil && v.MemMiB > 0 {
			return v.MemMiB
		}
	}
	return rec.MemMiB
}

// balloonErr is the API's error for a failed balloon call to sandbox
// id's VMM: its 404 (a VMM without a balloon) says so, its 400 and 409
// keep their status, anything else is the VMM's failure (500).
func balloonErr(id string, err error) error {
	var ve *vmmctl.Error
	switch {
	case errors.As(err, &ve) && ve.Status == http.StatusNotFound:
		return errf(404, "sandbox %s has no balloon (its template was created without --balloon)", id)
	case errors.As(err, &ve) && (ve.Status == http.StatusBadRequest || ve.Status == http.StatusConflict):
		return errf(ve.Status, "VMM: %s", ve.Message)
	case errors.As(err, &ve):
		return fmt.Errorf("VMM: %s", ve.Message)
	}
	return err
}

// nonNilStats returns rep with its Stats an empty list rather than null
// (the API's answer always has the list).
func nonNilStats(rep *vmmctl.BalloonReply) *vmmctl.BalloonReply {
	if rep.Stats == nil {
		rep.Stats = []vmmctl.BalloonStat{}
	}
	return rep
}
