package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// TenantHeader names the tenant of a request on the unix socket.
const TenantHeader = "X-Warren-Tenant"

// An Authenticator returns the tenant a request acts for.
type Authenticator func(r *http.Request) (string, error)

// HeaderAuth takes the tenant from TenantHeader, whoever sends it: for a
// socket only trusted processes can reach (tests, PeerAuth's root and
// operator). warren-hostd's unix socket uses PeerAuth, which checks the
// peer's uid first.
func HeaderAuth(r *http.Request) (string, error) {
	t := r.Header.Get(TenantHeader)
	if t == "" {
		return "", errf(401, "missing %s header", TenantHeader)
	}
	if !store.ValidTenant(t) {
		return "", errf(400, "bad tenant %q: want [a-z0-9-]{1,63}", t)
	}
	return t, nil
}

// TokenAuth takes the tenant from the bearer token (TCP): tokens maps
// each token to its tenant. A TenantHeader naming another tenant is
// refused.
func TokenAuth(tokens map[string]string) Authenticator {
	return func(r *http.Request) (string, error) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		t := tokens[strings.TrimSpace(tok)]
		if !ok || t == "" {
			return "", errf(401, "missing or unknown bearer token")
		}
		if h := r.Header.Get(TenantHeader); h != "" && h != t {
			return "", errf(403, "the token does not belong to tenant %q", h)
		}
		return t, nil
	}
}

// LoadTokens reads a tokens file: a JSON object {"token": "tenant", ...},
// which must not be readable by group or others.
func LoadTokens(path string) (map[string]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("tokens file %s: mode %v, want 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	for tok, t := range m {
		if len(tok) < 16 || !store.ValidTenant(t) {
			return nil, fmt.Errorf("tokens file %s: tokens must have 16+ characters and tenants match [a-z0-9-]{1,63}", path)
		}
	}
	return m, nil
}

// auditLog writes one JSON line per request.
type auditLog struct {
	mu sync.Mutex
	w  io.Writer
}

type auditEntry struct {
	Time       time.Time `json:"time"`
	Tenant     string    `json:"tenant,omitempty"`
	Method     string    `json:"method"`
	Path       string    `json:"path"`
	Status     int       `json:"status"`
	DurationMS float64   `json:"duration_ms"`
	Sandbox    string    `json:"sandbox,omitempty"`
	Template   string    `json:"template,omitempty"`
	Secret     string    `json:"secret,omitempty"` // its name; values are never logged
	Remote     string    `json:"remote,omitempty"`
}

func (a *auditLog) write(e auditEntry) {
	if a.w == nil {
		return
	}
	b, _ := json.Marshal(e)
	a.mu.Lock()
	a.w.Write(append(b, '\n'))
	a.mu.Unlock()
}

type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(s int) {
	if r.status == 0 {
		r.status = s
	}
	r.ResponseWriter.WriteHeader(s)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	st, msg := errStatus(err)
	e := wire.Error{Error: msg}
	var ae *apiError
	if errors.As(err, &ae) {
		e.Code = ae.code
	}
	writeJSON(w, st, e)
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return errf(400, "bad request body: %v", err)
	}
	return nil
}

// reply answers v with status, or err when it is not nil.
func reply(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, status, v)
}

// nonNil returns l, or an empty slice for nil: a list answers [], not null.
func nonNil[T any](l []T) []T {
	if l == nil {
		return []T{}
	}
	return l
}

// withBody decodes the request's JSON body into a T for h, or answers 400.
// A is what h is handed besides (the tenant, or its sandbox).
func withBody[A, T any](h func(w http.ResponseWriter, r *http.Request, a A, req T)) func(w http.ResponseWriter, r *http.Request, a A) {
	return func(w http.ResponseWriter, r *http.Request, a A) {
		var req T
		if err := decode(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		h(w, r, a, req)
	}
}

// lockedOp runs fn as an operation (progress.go) with s locked, answering
// 200 and what fn returns.
func (d *Daemon) lockedOp(w http.ResponseWriter, r *http.Request, s *sbState, fn func(ctx context.Context, s *sbState, o *op) (any, error)) {
	newOp().run(w, r, func(o *op) (int, any, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		res, err := fn(d.ctx, s, o)
		return 200, res, err
	})
}

type handlerFunc func(w http.ResponseWriter, r *http.Request, tenant string)

// Handler returns the API's handler; auth names each request's tenant.
func (d *Daemon) Handler(auth Authenticator) http.Handler {
	if auth == nil {
		auth = HeaderAuth
	}
	mux := http.NewServeMux()
	handle := func(pattern string, h handlerFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			rec := &recorder{ResponseWriter: w}
			tenant, err := auth(r)
			if err != nil {
				writeErr(rec, err)
			} else {
				h(rec, r, tenant)
			}
			if rec.status == 0 {
				rec.status = 200
			}
			dur := time.Since(start)
			d.audit.write(auditEntry{Time: start.UTC(), Tenant: tenant, Method: r.Method, Path: r.URL.Path, Status: rec.status,
				DurationMS: float64(dur.Microseconds()) / 1000, Sandbox: r.PathValue("id"), Secret: r.PathValue("name"), Remote: r.RemoteAddr})
			d.obs.ObserveRequest(tenant, r.Method, pattern, rec.status, dur)
		})
	}
	handle("GET /v1/health", func(w http.ResponseWriter, r *http.Request, tenant string) {
		writeJSON(w, 200, wire.Health{OK: true, Tenant: tenant, Cgroups: d.cgroupVersion()})
	})
	handle("POST /v1/templates", withBody(d.postTemplate))
	handle("GET /v1/templates", d.listTemplates)
	handle("GET /v1/templates/{id}", d.withTemplate(func(w http.ResponseWriter, r *http.Request, t *tplState) {
		writeJSON(w, 200, *t.view.Load())
	}))
	handle("DELETE /v1/templates/{id}", d.withTemplate(func(w http.ResponseWriter, r *http.Request, t *tplState) {
		reply(w, 200, map[string]string{"deleted": r.PathValue("id")}, d.deleteTemplate(t))
	}))
	handle("GET /v1/templates/{id}/bundle", d.withTemplate(d.getTemplateBundle)) // templatebundle.go
	handle("POST /v1/templates/import", d.postTemplateImport)
	handle("POST /v1/images", d.postImage)
	handle("GET /v1/images", d.listImages)
	handle("DELETE /v1/images/{key}", d.delImage)
	handle("POST /v1/sandboxes", withBody(func(w http.ResponseWriter, r *http.Request, tenant string, req wire.SandboxRequest) {
		newOp().run(w, r, func(o *op) (int, any, error) { return d.createSandbox(o, tenant, req) })
	}))
	handle("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request, tenant string) {
		writeJSON(w, 200, nonNil(d.listSandboxes(tenant)))
	})
	handle("GET /v1/sandboxes/{id}", d.withSandbox(func(w http.ResponseWriter, r *http.Request, s *sbState) {
		writeJSON(w, 200, d.snapshotRec(s))
	}))
	handle("DELETE /v1/sandboxes/{id}", d.withSandbox(func(w http.ResponseWriter, r *http.Request, s *sbState) {
		err := d.deleteSandbox(s)
		reply(w, 200, map[string]string{"deleted": s.rec.ID}, err)
	}))
	handle("POST /v1/sandboxes/{id}/exec", d.withSandbox(withBody(d.exec)))
	handle("GET /v1/sandboxes/{id}/files", d.withSandbox(d.getFile))
	handle("PUT /v1/sandboxes/{id}/files", d.withSandbox(d.putFile))
	d.fileRoutes(handle)
	d.processRoutes(handle)
	handle("POST /v1/sandboxes/{id}/pause", d.withSandbox(d.postPause))
	handle("POST /v1/sandboxes/{id}/resume", d.withSandbox(func(w http.ResponseWriter, r *http.Request, s *sbState) {
		d.lockedOp(w, r, s, d.resume)
	}))
	handle("POST /v1/sandboxes/{id}/snapshots", d.withSandbox(withBody(d.postSnapshot)))
	handle("GET /v1/sandboxes/{id}/snapshots", d.withSandbox(func(w http.ResponseWriter, r *http.Request, s *sbState) {
		rec := d.snapshotRec(s)
		writeJSON(w, 200, wire.SnapshotList{Snapshots: nonNil(rec.Snapshots), Rolling: rec.Rolling})
	}))
	handle("POST /v1/sandboxes/{id}/rollback", d.withSandbox(withBody(func(w http.ResponseWriter, r *http.Request, s *sbState, req wire.RollbackRequest) {
		s.mu.Lock()
		defer s.mu.Unlock()
		res, err := d.rollback(r.Context(), s, req.Snapshot)
		reply(w, 200, res, err)
	})))
	handle("GET /v1/sandboxes/{id}/bundle", d.withSandbox(d.getBundle)) // bundle.go
	handle("POST /v1/sandboxes/import", d.postImport)
	handle("POST /v1/sandboxes/{id}/fork", d.withSandbox(withBody(func(w http.ResponseWriter, r *http.Request, s *sbState, req wire.ForkRequest) {
		if req.N == 0 {
			req.N = 1
		}
		newOp().run(w, r, func(o *op) (int, any, error) { return d.fork(o, s, req.N) })
	})))
	handle("GET /v1/sandboxes/{id}/egress", d.withNetwork(d.getEgress))
	handle("PUT /v1/sandboxes/{id}/egress", d.withNetwork(d.putEgress))
	handle("GET /v1/sandboxes/{id}/balloon", d.withSandbox(d.getBalloon))
	handle("PUT /v1/sandboxes/{id}/balloon", d.withSandbox(d.putBalloon))
	handle("PUT /v1/secrets/{name}", d.putSecret)
	handle("GET /v1/secrets", d.listSecrets)
	handle("DELETE /v1/secrets/{name}", d.deleteSecret)
	handle("GET /v1/events", d.streamEvents)
	handle("POST /v1/keys", d.postKey)
	handle("GET /v1/keys", d.getKey)
	handle("DELETE /v1/keys", d.deleteKey)
	handle("GET /v1/store", d.getStore)
	return mux
}

func (d *Daemon) cgroupVersion() int {
	if d.cg == nil {
		return 0
	}
	return d.cg.Version
}

// withSandbox resolves {id} to the tenant's sandbox, or answers 404.
func (d *Daemon) withSandbox(h func(w http.ResponseWriter, r *http.Request, s *sbState)) handlerFunc {
	return withOwned("sandbox", d.sandbox, h)
}

// withTemplate resolves {id} to the tenant's template, or answers 404.
func (d *Daemon) withTemplate(h func(w http.ResponseWriter, r *http.Request, t *tplState)) handlerFunc {
	return withOwned("template", d.template, h)
}

// withOwned resolves {id} with find (nil: the tenant has no such kind),
// or answers 404.
func withOwned[S any](kind string, find func(tenant, id string) *S, h func(w http.ResponseWriter, r *http.Request, s *S)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, tenant string) {
		s := find(tenant, r.PathValue("id"))
		if s == nil {
			writeErr(w, errf(404, "%s %q not found", kind, r.PathValue("id")))
			return
		}
		h(w, r, s)
	}
}

func (d *Daemon) postTemplate(w http.ResponseWriter, r *http.Request, tenant string, req wire.TemplateRequest) {
	newOp().run(w, r, func(o *op) (int, any, error) { return d.buildTemplate(o, tenant, req) })
}

func (d *Daemon) listTemplates(w http.ResponseWriter, r *http.Request, tenant string) {
	d.mu.Lock()
	out := []store.Template{}
	for _, t := range d.templates {
		if t.rec.Tenant == tenant {
			out = append(out, *t.view.Load())
		}
	}
	d.mu.Unlock()
	writeJSON(w, 200, out)
}

func (d *Daemon) postPause(w http.ResponseWriter, r *http.Request, s *sbState) {
	toDisk, _ := strconv.ParseBool(r.URL.Query().Get("to_disk"))
	if toDisk {
		d.lockedOp(w, r, s, d.suspendLocked)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := d.pause(r.Context(), s); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, copyRec(s.rec))
}

func (d *Daemon) postSnapshot(w http.ResponseWriter, r *http.Request, s *sbState, req wire.SnapshotRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Every != "" {
		if req.Every == "0" || req.Every == "off" {
			if s.stopRolling != nil {
				s.stopRolling()
				s.stopRolling = nil
			}
			s.rec.Rolling = nil
			d.save(s)
			writeJSON(w, 200, wire.RollingReply{})
			return
		}
		every, err := time.ParseDuration(req.Every)
		if err != nil || every < time.Second {
			writeErr(w, errf(400, "every %q: want a duration of at least 1s", req.Every))
			return
		}
		if err := running(s, true); err != nil {
			writeErr(w, err)
			return
		}
		if req.Keep <= 0 {
			req.Keep = 8
		}
		s.rec.Rolling = &store.Rolling{Every: every.String(), Keep: req.Keep}
		s.chain = 0
		d.save(s)
		d.startRolling(s)
		writeJSON(w, http.StatusAccepted, wire.RollingReply{Rolling: s.rec.Rolling})
		return
	}
	if err := running(s, true); err != nil {
		writeErr(w, err)
		return
	}
	if req.Name == "" {
		req.Name = freeName(s.rec, "snap")
	}
	kind := "full"
	if req.Incremental {
		kind = "incremental"
	}
	snap, err := d.takeSnapshot(r.Context(), s, req.Name, kind, false)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snap)
}

// frameWriter turns the agent's output into wire.ExecFrames; the answer's
// header goes out with the first frame, so an error before any output is
// answered with a proper status.
type frameWriter struct {
	w       http.ResponseWriter
	enc     *json.Encoder
	started bool
	stderr  bool
}

func (f *frameWriter) start() {
	if !f.started {
		f.started = true
		f.w.Header().Set("Content-Type", "application/x-ndjson")
		f.w.WriteHeader(200)
		f.enc = json.NewEncoder(f.w)
	}
}

func (f *frameWriter) frame(fr wire.ExecFrame) error {
	f.start()
	err := f.enc.Encode(fr)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return err
}

type streamOut struct {
	f      *frameWriter
	stderr bool
}

func (s streamOut) Write(p []byte) (int, error) {
	fr := wire.ExecFrame{Stdout: p}
	if s.stderr {
		fr = wire.ExecFrame{Stderr: p}
	}
	if err := s.f.frame(fr); err != nil {
		return 0, err
	}
	return len(p), nil
}

func agentErr(err error) error {
	var ae *agentwire.Error
	if errors.As(err, &ae) && ae.Status >= 400 && ae.Status < 500 {
		return &apiError{status: ae.Status, msg: err.Error(), code: ae.Code}
	}
	return errf(502, "guest agent: %v", err)
}

func (d *Daemon) readyAgent(s *sbState) (*agentclient.Client, []string, error) {
	rec := d.snapshotRec(s)
	if rec.Status != store.Running {
		return nil, nil, errf(409, "sandbox %s is %s", rec.ID, rec.Status)
	}
	return s.agent, rec.Env, nil
}

func (d *Daemon) exec(w http.ResponseWriter, r *http.Request, s *sbState, req wire.ExecRequest) {
	if len(req.Argv) == 0 {
		writeErr(w, errf(400, "argv is required"))
		return
	}
	c, env, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	start := time.Now()
	ar := agentwire.ExecRequest{Argv: req.Argv, Env: append(append([]string(nil), env...), req.Env...), Cwd: req.Cwd, TimeoutMS: req.TimeoutMS}
	if req.Stdin != nil {
		ar.Input = bytes.NewReader(req.Stdin)
	}
	fw := &frameWriter{w: w}
	st, err := c.ExecStatus(r.Context(), ar, streamOut{f: fw}, streamOut{f: fw, stderr: true})
	d.obs.ObserveOp("exec", time.Since(start), err)
	if err != nil && !errors.Is(err, agentclient.ErrTimedOut) {
		if !fw.started {
			writeErr(w, agentErr(err))
			return
		}
		fw.frame(wire.ExecFrame{Error: err.Error()})
		return
	}
	code := st.Code
	fw.frame(wire.ExecFrame{Exit: &code, Signal: st.Signal, TimedOut: st.TimedOut})
}

func (d *Daemon) getFile(w http.ResponseWriter, r *http.Request, s *sbState) {
	p := r.URL.Query().Get("path")
	if !strings.HasPrefix(p, "/") {
		writeErr(w, errf(400, "path must be absolute"))
		return
	}
	c, _, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	fi, err := c.Stat(r.Context(), p)
	if err != nil {
		writeErr(w, agentErr(err))
		return
	}
	if fi.IsDir {
		writeErr(w, errf(400, "%s is a directory", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Warren-Mode", strconv.FormatUint(uint64(fi.Mode.Perm()), 8))
	bw := bufio.NewWriterSize(w, 64<<10)
	if _, err := c.ReadFile(r.Context(), p, bw); err != nil {
		// Headers may be out already: the connection is cut short.
		d.log.Warn("file download failed", "sandbox", s.rec.ID, "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
	bw.Flush()
}

func (d *Daemon) putFile(w http.ResponseWriter, r *http.Request, s *sbState) {
	p := r.URL.Query().Get("path")
	if !strings.HasPrefix(p, "/") {
		writeErr(w, errf(400, "path must be absolute"))
		return
	}
	mode := uint64(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			writeErr(w, errf(400, "bad mode %q", m))
			return
		}
	}
	c, _, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	fi, err := c.WriteFile(r.Context(), p, r.Body, fs.FileMode(mode&0o777))
	if err != nil {
		writeErr(w, agentErr(err))
		return
	}
	writeJSON(w, 200, fi)
}

// streamEvents streams the tenant's events as NDJSON until the client
// goes away.
func (d *Daemon) streamEvents(w http.ResponseWriter, r *http.Request, tenant string) {
	ch, cancel := d.events.subscribe(tenant)
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	fl, _ := w.(http.Flusher)
	if fl != nil {
		fl.Flush()
	}
	enc := json.NewEncoder(w)
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	for {
		select {
		case e := <-ch:
			if enc.Encode(e) != nil {
				return
			}
			if fl != nil {
				fl.Flush()
			}
		case <-ctx.Done():
			return
		case <-d.ctx.Done():
			return
		}
	}
}
