// Package clienttest is a stand-in for warren-hostd in tests of its
// clients: an in-memory daemon on a unix socket (or TCP with a token)
// that speaks the API's shapes (progress streams, exec frames, files,
// errors, tenants, secrets, egress policies, memory balloons, encryption keys) without any VM. Exec echoes its argv on stdout, says
// "err" on stderr, and exits with the number given as `exit N`; the
// process API (processes.go) and the file API (files.go) work in memory.
package clienttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/vmmctl"
)

// Stub is the fake daemon.
type Stub struct {
	Socket string // its unix socket
	URL    string // its TCP address, http://...
	Token  string // the bearer token of tenant "tok"

	mu        sync.Mutex
	n         int
	templates map[string]*store.Template
	sandboxes map[string]*store.Sandbox
	files     map[string][]byte
	secrets   map[string]map[string]string    // tenant -> name -> value
	egress    map[string]json.RawMessage      // sandbox -> policy
	balloons  map[string]*vmmctl.BalloonReply // sandbox -> its balloon (a "balloon" template's)
	keys      map[string]*wire.KeyInfo        // tenant -> its key
	// procs are the processes by "SANDBOX/ID", procOrder their ids by
	// sandbox in start order, nproc the last id's number
	// (processes.go); dirs the guest directories made, "SANDBOX:PATH"
	// (files.go).
	procs     map[string]*stubProc
	procOrder map[string][]string
	nproc     int
	dirs      map[string]bool
	// Requests records "TENANT METHOD PATH" of every request.
	Requests []string
	// Uploads holds the bodies of POST /v1/images by upload id, and
	// TemplateRequests every POST /v1/templates body, in order.
	Uploads          map[string][]byte
	TemplateRequests []wire.TemplateRequest
}

// Upload returns the body uploaded as id (POST /v1/images).
func (s *Stub) Upload(id string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.Uploads[id]
	return b, ok
}

// LastTemplateRequest returns the last POST /v1/templates body.
func (s *Stub) LastTemplateRequest() wire.TemplateRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.TemplateRequests) == 0 {
		return wire.TemplateRequest{}
	}
	return s.TemplateRequests[len(s.TemplateRequests)-1]
}

// New starts a Stub, stopped at the test's end.
func New(t testing.TB) *Stub {
	dir, err := os.MkdirTemp("", "hostd-stub")
	if err != nil {
		t.Fatal(err)
	}
	s := &Stub{Socket: filepath.Join(dir, "hostd.sock"), Token: "0123456789abcdef-token",
		templates: map[string]*store.Template{}, sandboxes: map[string]*store.Sandbox{}, files: map[string][]byte{},
		secrets: map[string]map[string]string{}, egress: map[string]json.RawMessage{}, balloons: map[string]*vmmctl.BalloonReply{}, keys: map[string]*wire.KeyInfo{},
		Uploads: map[string][]byte{}, procs: map[string]*stubProc{}, procOrder: map[string][]string{}, dirs: map[string]bool{}}
	ul, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.URL = "http://" + tl.Addr().String()
	h := s.handler()
	us, ts := &http.Server{Handler: h}, &http.Server{Handler: h}
	go us.Serve(ul)
	go ts.Serve(tl)
	t.Cleanup(func() { us.Close(); ts.Close(); os.RemoveAll(dir) })
	return s
}

// Secret returns the value tenant's secret name was given.
func (s *Stub) Secret(tenant, name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.secrets[tenant][name]
	return v, ok
}

func (s *Stub) id(prefix string) string {
	s.n++
	return fmt.Sprintf("%s-%012x", prefix, s.n)
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status int, msg string) {
	reply(w, status, wire.Error{Error: msg})
}

// long answers a long operation: progress lines then the result, or the
// plain result without Accept: application/x-ndjson.
func long(w http.ResponseWriter, r *http.Request, steps []string, status int, result any) {
	if !strings.Contains(r.Header.Get("Accept"), "ndjson") {
		reply(w, status, result)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for i, st := range steps {
		enc.Encode(wire.Progress{Step: st, Pct: (i + 1) * 100 / (len(steps) + 1)})
	}
	enc.Encode(wire.Result{Result: result, Status: status})
}

func (s *Stub) handler() http.Handler {
	mux := http.NewServeMux()
	auth := func(h func(w http.ResponseWriter, r *http.Request, tenant string)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tenant := r.Header.Get("X-Warren-Tenant")
			if a := r.Header.Get("Authorization"); a != "" {
				if a != "Bearer "+s.Token {
					fail(w, 401, "missing or unknown bearer token")
					return
				}
				if tenant != "" && tenant != "tok" {
					fail(w, 403, "the token does not belong to tenant "+tenant)
					return
				}
				tenant = "tok"
			}
			if tenant == "" {
				fail(w, 401, "missing X-Warren-Tenant header")
				return
			}
			s.mu.Lock()
			s.Requests = append(s.Requests, tenant+" "+r.Method+" "+r.URL.Path)
			s.mu.Unlock()
			h(w, r, tenant)
		}
	}
	sb := func(h func(w http.ResponseWriter, r *http.Request, sb *store.Sandbox)) http.HandlerFunc {
		return auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
			s.mu.Lock()
			x := s.sandboxes[r.PathValue("id")]
			s.mu.Unlock()
			if x == nil || x.Tenant != tenant {
				fail(w, 404, fmt.Sprintf("sandbox %q not found", r.PathValue("id")))
				return
			}
			h(w, r, x)
		})
	}
	mux.HandleFunc("GET /v1/health", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		reply(w, 200, wire.Health{OK: true, Tenant: tenant})
	}))
	mux.HandleFunc("POST /v1/templates", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		var req wire.TemplateRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.Kernel == "" && req.Image == "" {
			fail(w, 400, "kernel is required")
			return
		}
		// As warren-hostd: files of its guest directory by name, never a
		// host path.
		for _, v := range append([]string{req.Kernel, req.Initramfs}, req.Disks...) {
			if strings.ContainsRune(v, '/') {
				fail(w, 400, fmt.Sprintf("%q is a host path: templates name files of the daemon's guest directory (warren-hostd --guest-dir) by name", v))
				return
			}
		}
		s.mu.Lock()
		s.TemplateRequests = append(s.TemplateRequests, req)
		if id, ok := strings.CutPrefix(req.Image, "upload:"); ok && s.Uploads[id] == nil {
			s.mu.Unlock()
			fail(w, 404, "no upload "+id)
			return
		}
		t := &store.Template{ID: s.id("tp"), Tenant: tenant, Status: "ready", Kernel: req.Kernel, Initramfs: req.Initramfs, MemMiB: req.MemMiB, CPUs: req.CPUs, Network: req.Network, Balloon: req.Balloon, Created: time.Now()}
		if req.Image != "" {
			t.Image = &store.TemplateImage{Ref: req.Image, Digest: "sha256:0000", Base: "base0"}
		}
		s.templates[t.ID] = t
		s.mu.Unlock()
		long(w, r, []string{"booting the guest", "waiting for the agent", "snapshotting"}, 201, t)
	}))
	mux.HandleFunc("POST /v1/images", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		b, err := io.ReadAll(io.LimitReader(r.Body, 1<<30))
		if err != nil || len(b) == 0 {
			fail(w, 400, "empty image archive")
			return
		}
		s.mu.Lock()
		id := s.id("up")
		s.Uploads[id] = b
		s.mu.Unlock()
		reply(w, 201, wire.ImageUpload{ID: id, Ref: "upload:" + id, Bytes: int64(len(b))})
	}))
	mux.HandleFunc("GET /v1/images", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		l := wire.ImageList{Images: []store.Image{}}
		for _, t := range s.templates {
			if t.Tenant == tenant && t.Image != nil {
				l.Images = append(l.Images, store.Image{Key: t.Image.Base, Digest: t.Image.Digest, Ref: t.Image.Ref, Templates: []string{t.ID}})
			}
		}
		reply(w, 200, l)
	}))
	mux.HandleFunc("GET /v1/templates", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		reply(w, 200, ofTenant(s.templates, tenant, func(t *store.Template) string { return t.Tenant }))
	}))
	mux.HandleFunc("DELETE /v1/templates/{id}", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		t := s.templates[r.PathValue("id")]
		if t == nil || t.Tenant != tenant {
			fail(w, 404, "template not found")
			return
		}
		for _, x := range s.sandboxes {
			if x.Template == t.ID {
				fail(w, 409, "template in use")
				return
			}
		}
		delete(s.templates, t.ID)
		reply(w, 200, map[string]string{"deleted": t.ID})
	}))
	mux.HandleFunc("POST /v1/sandboxes", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		var req wire.SandboxRequest
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		t := s.templates[req.Template]
		if t == nil || t.Tenant != tenant {
			s.mu.Unlock()
			fail(w, 404, fmt.Sprintf("template %q not found", req.Template))
			return
		}
		for _, n := range req.Secrets {
			if _, ok := s.secrets[tenant][n]; !ok {
				s.mu.Unlock()
				fail(w, 400, fmt.Sprintf("secret %q not found", n))
				return
			}
		}
		if len(req.Egress) > 0 && !t.Network {
			s.mu.Unlock()
			fail(w, 400, "egress needs a template built with \"network\": true")
			return
		}
		x := &store.Sandbox{ID: s.id("sb"), Tenant: tenant, Template: t.ID, Status: "running", PID: 4242, MemMiB: req.MemMiB, Env: req.Env, Labels: req.Labels,
			Network: t.Network, Egress: req.Egress, Secrets: req.Secrets, Created: time.Now()}
		s.sandboxes[x.ID] = x
		if t.Balloon {
			s.balloons[x.ID] = &vmmctl.BalloonReply{Active: true, FreePageReporting: true, StatsQueue: true,
				Stats: []vmmctl.BalloonStat{{Tag: 4, Name: "free-memory", Value: 100 << 20}}}
		}
		if x.Network {
			s.egress[x.ID] = req.Egress
			if len(req.Egress) == 0 {
				s.egress[x.ID] = json.RawMessage("{}")
			}
		}
		s.mu.Unlock()
		long(w, r, []string{"restoring the snapshot", "waiting for the agent"}, 201, x)
	}))
	mux.HandleFunc("GET /v1/sandboxes", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		reply(w, 200, ofTenant(s.sandboxes, tenant, func(x *store.Sandbox) string { return x.Tenant }))
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) { reply(w, 200, x) }))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		s.mu.Lock()
		delete(s.sandboxes, x.ID)
		s.mu.Unlock()
		reply(w, 200, map[string]string{"deleted": x.ID})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		var req wire.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		status := x.Status
		s.mu.Unlock()
		if status != "running" {
			fail(w, 409, "sandbox "+x.ID+" is "+status)
			return
		}
		if len(req.Argv) > 0 && req.Argv[0] == "no-such-program" {
			// As warren-hostd answers the agent's refusal (agentErr).
			reply(w, 404, wire.Error{Error: "agent: no-such-program: executable file not found in $PATH (not_found, HTTP 404)", Code: "not_found"})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(wire.ExecFrame{Stdout: []byte(strings.Join(req.Argv, " ") + "\n")})
		if req.Stdin != nil {
			enc.Encode(wire.ExecFrame{Stdout: req.Stdin})
		}
		enc.Encode(wire.ExecFrame{Stderr: []byte("err\n")})
		code := 0
		if len(req.Argv) == 2 && req.Argv[0] == "exit" {
			code, _ = strconv.Atoi(req.Argv[1])
		}
		enc.Encode(wire.ExecFrame{Exit: &code})
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		b, _ := io.ReadAll(r.Body)
		p := r.URL.Query().Get("path")
		s.mu.Lock()
		s.files[x.ID+":"+p] = b
		s.files[x.ID+":"+p+"#mode"] = []byte(r.URL.Query().Get("mode"))
		s.mu.Unlock()
		reply(w, 200, wire.FileInfo{Name: filepath.Base(p), Size: int64(len(b))})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		p := r.URL.Query().Get("path")
		s.mu.Lock()
		b, ok := s.files[x.ID+":"+p]
		mode := s.files[x.ID+":"+p+"#mode"]
		s.mu.Unlock()
		if !ok {
			fail(w, 404, "guest agent: "+p+": no such file or directory")
			return
		}
		w.Header().Set("X-Warren-Mode", string(mode))
		w.Write(b)
	}))
	setStatus := func(x *store.Sandbox, st string) {
		s.mu.Lock()
		x.Status = st
		s.mu.Unlock()
	}
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		if r.URL.Query().Get("to_disk") == "true" {
			setStatus(x, "suspended")
			long(w, r, []string{"snapshotting", "stopping the VMM"}, 200, x)
			return
		}
		setStatus(x, "paused")
		reply(w, 200, x)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		setStatus(x, "running")
		long(w, r, []string{"resuming"}, 200, x)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		var req wire.SnapshotRequest
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		defer s.mu.Unlock()
		if req.Every == "0" {
			x.Rolling = nil
			reply(w, 200, wire.RollingReply{})
			return
		}
		if req.Every != "" {
			x.Rolling = &store.Rolling{Every: req.Every, Keep: max(req.Keep, 8)}
			reply(w, 202, wire.RollingReply{Rolling: x.Rolling})
			return
		}
		if req.Name == "" {
			req.Name = fmt.Sprintf("snap-%d", len(x.Snapshots)+1)
		}
		kind := "full"
		if req.Incremental {
			kind = "incremental"
		}
		snap := store.Snapshot{Name: req.Name, Kind: kind, Time: time.Now(), Bytes: 4096}
		x.Snapshots = append(x.Snapshots, snap)
		reply(w, 201, snap)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/snapshots", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		s.mu.Lock()
		defer s.mu.Unlock()
		reply(w, 200, wire.SnapshotList{Snapshots: x.Snapshots, Rolling: x.Rolling})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/rollback", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		var req wire.RollbackRequest
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, sn := range x.Snapshots {
			if sn.Name == req.Snapshot {
				reply(w, 200, wire.RollbackReply{Snapshot: sn.Name, Line: "rolled back to " + sn.Name})
				return
			}
		}
		fail(w, 404, "snapshot "+req.Snapshot+" not found")
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		var req wire.ForkRequest
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		var kids []store.Sandbox
		for range max(req.N, 1) {
			k := &store.Sandbox{ID: s.id("sb"), Tenant: x.Tenant, Template: x.Template, Status: "running", Parent: x.ID,
				BalloonTargetMiB: x.BalloonTargetMiB, Created: time.Now()}
			s.sandboxes[k.ID] = k
			if b := s.balloons[x.ID]; b != nil {
				c := *b
				s.balloons[k.ID] = &c
			}
			kids = append(kids, *k)
		}
		s.mu.Unlock()
		long(w, r, []string{"forking"}, 201, wire.ForkResult{Parent: x.ID, PauseMS: 1.5, Children: kids})
	}))
	mux.HandleFunc("GET /v1/keys", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		k := s.keys[tenant]
		s.mu.Unlock()
		if k == nil {
			fail(w, 404, "tenant "+tenant+" has no encryption key")
			return
		}
		reply(w, 200, k)
	}))
	mux.HandleFunc("POST /v1/keys", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.keys[tenant] != nil {
			fail(w, 409, "tenant "+tenant+" has a key")
			return
		}
		s.keys[tenant] = &wire.KeyInfo{Tenant: tenant, KeyID: "wk1-" + s.id("k")}
		reply(w, 201, s.keys[tenant])
	}))
	mux.HandleFunc("DELETE /v1/keys", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		k := s.keys[tenant]
		if k == nil || k.Revoked {
			fail(w, 404, "tenant "+tenant+" has no encryption key")
			return
		}
		*k = wire.KeyInfo{Tenant: tenant, Revoked: true}
		out := *k
		for id, sb := range s.sandboxes {
			if sb.Tenant == tenant && sb.Status == store.Running {
				sb.Status = store.Stopped
				out.Stopped = append(out.Stopped, id)
			}
		}
		sort.Strings(out.Stopped)
		reply(w, 200, out)
	}))
	mux.HandleFunc("PUT /v1/secrets/{name}", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		b, _ := io.ReadAll(r.Body)
		if len(b) == 0 {
			fail(w, 400, "the value is empty")
			return
		}
		s.mu.Lock()
		if s.secrets[tenant] == nil {
			s.secrets[tenant] = map[string]string{}
		}
		s.secrets[tenant][r.PathValue("name")] = string(b)
		s.mu.Unlock()
		reply(w, 201, wire.Secret{Name: r.PathValue("name")})
	}))
	mux.HandleFunc("GET /v1/secrets", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		l := wire.SecretList{Names: []string{}}
		for n := range s.secrets[tenant] {
			l.Names = append(l.Names, n)
		}
		s.mu.Unlock()
		sort.Strings(l.Names)
		reply(w, 200, l)
	}))
	mux.HandleFunc("DELETE /v1/secrets/{name}", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		s.mu.Lock()
		_, ok := s.secrets[tenant][r.PathValue("name")]
		delete(s.secrets[tenant], r.PathValue("name"))
		s.mu.Unlock()
		if !ok {
			fail(w, 404, "secret not found")
			return
		}
		reply(w, 200, wire.Secret{Name: r.PathValue("name")})
	}))
	egress := func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !x.Network {
			fail(w, 404, "sandbox "+x.ID+" has no network")
			return
		}
		if r.Method == http.MethodPut {
			b, _ := io.ReadAll(r.Body)
			if !json.Valid(b) {
				fail(w, 400, "egress: not JSON")
				return
			}
			s.egress[x.ID] = b
			x.Egress = b
		}
		reply(w, 200, wire.EgressReply{Policy: s.egress[x.ID], Stats: json.RawMessage(`{"passed":0}`), Audit: "egress.jsonl"})
	}
	mux.HandleFunc("GET /v1/sandboxes/{id}/egress", sb(egress))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/egress", sb(egress))
	// The balloon, as warren-hostd answers it: the driver reaches the
	// target at once.
	balloon := func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		var req vmmctl.BalloonRequest
		if r.Method == http.MethodPut {
			dec := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				fail(w, 400, "bad request body: "+err.Error())
				return
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		b := s.balloons[x.ID]
		if b == nil {
			fail(w, 404, "sandbox "+x.ID+" has no balloon (its template was created without --balloon)")
			return
		}
		if r.Method == http.MethodPut {
			if x.Status != "running" {
				fail(w, 409, "sandbox "+x.ID+" is "+x.Status)
				return
			}
			guest := 256
			if t := s.templates[x.Template]; t != nil && t.MemMiB > 0 {
				guest = t.MemMiB
			}
			if req.TargetMiB != nil && *req.TargetMiB > uint64(guest) {
				fail(w, 400, fmt.Sprintf("balloon: target %d MiB is more than the sandbox's %d MiB of guest memory", *req.TargetMiB, guest))
				return
			}
			if req.StatsIntervalS != nil {
				b.StatsIntervalS = float64(*req.StatsIntervalS)
			}
			if t := req.TargetMiB; t != nil {
				if *t > b.TargetMiB {
					b.Counters.InflatedPages += (*t - b.TargetMiB) << 8
				} else {
					b.Counters.DeflatedPages += (b.TargetMiB - *t) << 8
				}
				b.TargetMiB, b.ActualMiB = *t, *t
				b.TargetPages, b.ActualPages = uint32(*t<<8), uint32(*t<<8)
				v := *t
				x.BalloonTargetMiB = &v
			}
		} else if x.Status != "running" && x.Status != "paused" {
			fail(w, 409, "sandbox "+x.ID+" is "+x.Status)
			return
		}
		reply(w, 200, b)
	}
	mux.HandleFunc("GET /v1/sandboxes/{id}/balloon", sb(balloon))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/balloon", sb(balloon))
	s.processRoutes(mux, sb)
	s.fileRoutes(mux, sb)
	mux.HandleFunc("GET /v1/events", auth(func(w http.ResponseWriter, r *http.Request, tenant string) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(wire.Event{Time: time.Now(), Type: "created", Sandbox: "sb-000000000001"})
		enc.Encode(wire.Event{Time: time.Now(), Type: "paused", Sandbox: "sb-000000000001"})
	}))
	return mux
}

// ofTenant returns copies of the records of m whose tenant (owner's) is
// tenant: a tenant's listing, never null.
func ofTenant[T any](m map[string]*T, tenant string, owner func(*T) string) []T {
	l := []T{}
	for _, x := range m {
		if owner(x) == tenant {
			l = append(l, *x)
		}
	}
	return l
}
