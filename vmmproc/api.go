package vmmproc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/egress"
)

// The control API of a running VM (`warren run --api PATH`): JSON over
// HTTP/1.1 on the unix socket PATH.
//
//	POST /v1/pause     {}                                   -> {"paused": true}
//	POST /v1/resume    {}                                   -> {"paused": false}
//	POST /v1/snapshot  {"path": "/abs/DIR/NAME", "kind": "full"|"incremental"}
//	                                                        -> vmmctl.SnapshotReply
//	POST /v1/rollback  {"path": "/abs/DIR/NAME"}            -> vmmctl.RollbackReply
//	POST /v1/fork      {"n": N, "prefix": "/abs/PREFIX", "disk_dirs": [...]}
//	                                                        -> vmmctl.ForkReply
//	GET  /v1/disks                                          -> vmmctl.DisksReply
//	GET  /v1/working-set                                    -> vmmctl.WorkingSetReply
//	POST /v1/working-set/save  {}                           -> vmmctl.WorkingSetReply
//	GET  /v1/balloon                                        -> vmmctl.BalloonReply
//	PUT  /v1/balloon   vmmctl.BalloonRequest                -> vmmctl.BalloonReply
//
// Errors are answered with a 4xx or 5xx status and {"error": "..."}.
//
// Memory served by userfaultfd (`warren restore --lazy=uffd`): a fork, a
// full snapshot and a rollback first have the fault server install every
// remaining page and unregister (uffd.Server.Complete), since each reads
// or shares the memfd beyond the guest's own accesses (its holes must be
// its zero pages); an incremental snapshot needs nothing (the pages never
// served are its parent's, the layer the VM was restored from). The
// working-set calls answer the server's counters and write the working
// set recorded with --record-working-set (vmmctl/workingset.go).
//
// Disks: every snapshot freezes the writable disks at its instant (its
// answer names, per disk, the layer it records, that layer's chain and the
// VM's new live top: cow.DiskFiles); a rollback puts them back on new
// overlays over the snapshot's layers (its answer names the new tops); a
// fork answers the parent's new tops and each child's. GET /v1/disks
// answers the live tops and their chains, so that whoever keeps the files
// knows exactly which ones the running VM references.

// apiServer serves the control API of one VM.
type apiServer struct {
	vm   *vmm.VM
	snap *vmsnap.Snapshotter
	log  *slog.Logger
	// host is the fingerprint source snapshots are checked against.
	host vmsnap.FingerprintSource
	// disks are the VM's disks (the snapshotter's and the forker's).
	disks *cow.DiskSet
	// apiPath is the socket served; opts the VM's device options and
	// kvmPath its KVM device, which fork children inherit.
	apiPath string
	opts    runOptions
	kvmPath string
	// forker forks the VM; forkMu serialises forks.
	forker *cow.Forker
	forkMu sync.Mutex
	// egress is the VM's egress services (nil without --egress); sync its
	// agent re-sync service, which tells the guest the egress settings.
	egress *egress.Sandbox
	sync   *agentclient.SyncService
	// proc is the VMM process serving (its helper, jail, executable).
	proc *process
	// memMode is the memory mode the VM was restored in (empty: booted);
	// uffd its fault server in the Uffd mode (nil otherwise, owned by the
	// build), and workingSet the file the recorded working set is saved
	// to ("" records none).
	memMode    vmsnap.MemoryMode
	uffd       *uffd.Server
	workingSet string
}

// serveAPI listens on the unix socket path (replacing a stale socket file)
// and serves the control API until the returned function is called.
func serveAPI(path string, a *apiServer) (func(), error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("--api %s: another VM serves there", path)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--api %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/pause", a.pause)
	mux.HandleFunc("POST /v1/resume", a.resume)
	mux.HandleFunc("POST /v1/snapshot", a.snapshot)
	mux.HandleFunc("POST /v1/rollback", a.rollback)
	mux.HandleFunc("POST /v1/fork", a.fork)
	mux.HandleFunc("GET /v1/disks", a.getDisks)
	mux.HandleFunc("GET /v1/working-set", a.getWorkingSet)
	mux.HandleFunc("POST /v1/working-set/save", a.saveWorkingSet)
	mux.HandleFunc("GET /v1/egress", a.getEgress)
	mux.HandleFunc("PUT /v1/egress", a.putEgress)
	mux.HandleFunc("GET /v1/balloon", a.getBalloon)
	mux.HandleFunc("PUT /v1/balloon", a.putBalloon)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return func() { srv.Close(); os.Remove(path) }, nil
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func replyErr(w http.ResponseWriter, status int, err error) {
	reply(w, status, vmmctl.ErrorReply{Error: err.Error()})
}

// decodeRequest decodes r's JSON body (at most 64 KiB, no unknown fields)
// into req and checks that the snapshot path path returns is absolute; it
// answers 400 and returns false otherwise.
func decodeRequest(w http.ResponseWriter, r *http.Request, req any, path func() string) bool {
	if err := strictjson.Decode(io.LimitReader(r.Body, 1<<16), req); err != nil {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("bad request: %w", err))
		return false
	}
	if p := path(); !filepath.IsAbs(p) {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("snapshot path %q is not absolute", p))
		return false
	}
	return true
}

func (a *apiServer) pause(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := a.vm.Pause(ctx); err != nil {
		replyErr(w, http.StatusConflict, err)
		return
	}
	reply(w, http.StatusOK, vmmctl.PauseReply{Paused: true})
}

func (a *apiServer) resume(w http.ResponseWriter, r *http.Request) {
	if err := a.vm.Resume(); err != nil {
		replyErr(w, http.StatusConflict, err)
		return
	}
	reply(w, http.StatusOK, vmmctl.PauseReply{Paused: false})
}

func (a *apiServer) snapshot(w http.ResponseWriter, r *http.Request) {
	var req vmmctl.SnapshotRequest
	if !decodeRequest(w, r, &req, func() string { return req.Path }) {
		return
	}
	if req.Kind == vmsnap.Full {
		if err := a.completeMemory("snapshot"); err != nil {
			replyErr(w, http.StatusInternalServerError, err)
			return
		}
	}
	rep, err := a.snap.Take(r.Context(), req.Path, req.Kind)
	if err != nil {
		replyErr(w, http.StatusInternalServerError, err)
		return
	}
	a.logReport("snapshot", rep.String(), rep.Path, rep.DiskWarning)
	reply(w, http.StatusOK, vmmctl.SnapshotReply{Path: rep.Path, Kind: string(rep.Kind), PauseMS: millis(rep.Pause), TotalMS: millis(rep.Total),
		Pages: rep.Pages, LayerBytes: rep.LayerBytes, StateBytes: rep.StateBytes, Layer: rep.LayerPath,
		Disks: withTops(rep.Disks, a.disks.Live()), Line: rep.String()})
}

// logReport logs the report line of a snapshot or rollback (op) at debug
// level, and its disk warning, if any, as a warning.
func (a *apiServer) logReport(op, line, path, diskWarning string) {
	a.log.Debug(op, "report", line)
	if diskWarning != "" {
		a.log.Warn(op+": disks", "path", path, "warning", diskWarning)
	}
}

// millis is d in milliseconds, to the microsecond, as the replies give
// durations.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// withTops names, for each of a snapshot's disk layers, the disk's live
// top from live.
func withTops(layers []vmsnap.DiskLayer, live []cow.DiskFiles) []cow.DiskFiles {
	out := []cow.DiskFiles{}
	for _, l := range layers {
		df := cow.DiskFiles{Index: l.Index, Layer: l.Layer, Chain: l.Chain}
		for _, d := range live {
			if d.Index == l.Index {
				df.Top = d.Top
			}
		}
		out = append(out, df)
	}
	return out
}

func (a *apiServer) getDisks(w http.ResponseWriter, r *http.Request) {
	reply(w, http.StatusOK, vmmctl.DisksReply{Disks: a.disks.Live()})
}

func (a *apiServer) rollback(w http.ResponseWriter, r *http.Request) {
	var req vmmctl.RollbackRequest
	if !decodeRequest(w, r, &req, func() string { return req.Path }) {
		return
	}
	start := time.Now()
	// The snapshot is checked whole before the VM is touched.
	snap, err := vmsnap.Load(req.Path, a.host)
	if err != nil {
		replyErr(w, http.StatusBadRequest, err)
		return
	}
	defer snap.Close()
	load := time.Since(start)
	if err := a.disks.CanRollback(snap); err != nil {
		// Refused before the VM is touched: a snapshot without disk
		// state for a VM with writable disks, or another VM's disks.
		replyErr(w, http.StatusConflict, fmt.Errorf("rollback: %w", err))
		return
	}
	if err := a.completeMemory("rollback"); err != nil {
		replyErr(w, http.StatusInternalServerError, err)
		return
	}
	rep, err := a.snap.Rollback(r.Context(), snap)
	if err != nil {
		replyErr(w, http.StatusInternalServerError, err)
		return
	}
	a.logReport("rollback", rep.String(), rep.Path, rep.DiskWarning)
	reply(w, http.StatusOK, vmmctl.RollbackReply{Path: rep.Path, PauseMS: millis(rep.Pause), TotalMS: millis(time.Since(start)), LoadMS: millis(load),
		Written: rep.Written, Cleared: rep.Cleared, Disks: a.disks.Live(),
		Line: fmt.Sprintf("%s (load %.1f ms)", rep.String(), millis(load))})
}

// completeMemory has the fault server of memory served by userfaultfd
// install every remaining page and unregister (uffd.Server.Complete), so
// that the memfd is an ordinary one before op (a fork, a full snapshot, a
// rollback) reads or shares it; it does nothing for other memory, or once
// done.
func (a *apiServer) completeMemory(op string) error {
	if a.uffd == nil {
		return nil
	}
	start := time.Now()
	if err := a.uffd.Complete(); err != nil {
		return fmt.Errorf("%s: memory served by userfaultfd: %w", op, err)
	}
	a.log.Debug("uffd: memory complete", "for", op, "ms", time.Since(start).Milliseconds())
	return nil
}

// workingSetReply is the answer of both working-set calls.
func (a *apiServer) workingSetReply() vmmctl.WorkingSetReply {
	rep := vmmctl.WorkingSetReply{Mode: string(a.memMode), Path: a.workingSet}
	if a.uffd != nil {
		st := a.uffd.Stats()
		rep.Stats = &st
	}
	return rep
}

func (a *apiServer) getWorkingSet(w http.ResponseWriter, r *http.Request) {
	reply(w, http.StatusOK, a.workingSetReply())
}

// saveWorkingSet stops recording and writes the working set to the file
// --record-working-set named.
func (a *apiServer) saveWorkingSet(w http.ResponseWriter, r *http.Request) {
	var req vmmctl.WorkingSetSaveRequest
	if err := strictjson.Decode(io.LimitReader(r.Body, 1<<16), &req); err != nil {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("bad request: %w", err))
		return
	}
	if a.uffd == nil || a.workingSet == "" {
		replyErr(w, http.StatusConflict, fmt.Errorf("this VM records no working set (memory mode %q; it needs --lazy=uffd with --record-working-set, on a host with userfaultfd)", a.memMode))
		return
	}
	ws := a.uffd.TakeWorkingSet()
	if err := uffd.WriteWorkingSet(a.workingSet, ws); err != nil {
		replyErr(w, http.StatusInternalServerError, err)
		return
	}
	rep := a.workingSetReply()
	rep.Pages, rep.Runs = ws.NumPages(), len(ws.Runs)
	a.log.Debug("uffd: working set saved", "path", a.workingSet, "pages", rep.Pages, "runs", rep.Runs)
	reply(w, http.StatusOK, rep)
}
