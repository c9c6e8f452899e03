package clienttest

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// The stub's file API beyond GET and PUT /files: a guest's files are the
// stub's files (PUT /files) and the directories made with mkdir ("/" is
// always there); list, stat, remove and rename work on them. Watch answers
// "ready", then a "create" for each file under the directory, and ends.

// fileInfo returns sandbox id's file or directory p; s.mu is held.
func (s *Stub) fileInfo(id, p string) (wire.FileInfo, bool) {
	if p == "/" || s.dirs[id+":"+p] {
		return wire.FileInfo{Name: path.Base(p), Path: p, IsDir: true, Mode: fs.ModeDir | 0o755, ModTime: time.Unix(0, 0).UTC()}, true
	}
	b, ok := s.files[id+":"+p]
	if !ok || strings.HasSuffix(p, "#mode") {
		return wire.FileInfo{}, false
	}
	return wire.FileInfo{Name: path.Base(p), Path: p, Size: int64(len(b)), Mode: 0o644, ModTime: time.Unix(0, 0).UTC()}, true
}

// under returns the paths of sandbox id's files and directories under
// dir, at most depth levels down, sorted; s.mu is held.
func (s *Stub) under(id, dir string, depth int) []string {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	var l []string
	add := func(key string) {
		p, ok := strings.CutPrefix(key, id+":")
		if !ok || strings.HasSuffix(p, "#mode") || !strings.HasPrefix(p, prefix) {
			return
		}
		if strings.Count(strings.TrimPrefix(p, prefix), "/") < depth {
			l = append(l, p)
		}
	}
	for k := range s.files {
		add(k)
	}
	for k := range s.dirs {
		add(k)
	}
	sort.Strings(l)
	return l
}

func notFound(w http.ResponseWriter, p string) {
	reply(w, 404, wire.Error{Error: "guest agent: " + p + ": no such file or directory (not_found, HTTP 404)", Code: agentwire.CodeNotFound})
}

func (s *Stub) fileRoutes(mux *http.ServeMux, sb func(func(http.ResponseWriter, *http.Request, *store.Sandbox)) http.HandlerFunc) {
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		p := r.URL.Query().Get("path")
		depth, _ := strconv.Atoi(r.URL.Query().Get("depth"))
		s.mu.Lock()
		defer s.mu.Unlock()
		if fi, ok := s.fileInfo(x.ID, p); !ok || !fi.IsDir {
			notFound(w, p)
			return
		}
		l := []wire.FileInfo{}
		for _, q := range s.under(x.ID, p, max(depth, 1)) {
			fi, _ := s.fileInfo(x.ID, q)
			l = append(l, fi)
		}
		reply(w, 200, l)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		p := r.URL.Query().Get("path")
		s.mu.Lock()
		fi, ok := s.fileInfo(x.ID, p)
		s.mu.Unlock()
		if !ok {
			notFound(w, p)
			return
		}
		reply(w, 200, fi)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/mkdir", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		p := r.URL.Query().Get("path")
		parents := r.URL.Query().Get("parents") == "1"
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.fileInfo(x.ID, p); ok && !parents {
			reply(w, 409, wire.Error{Error: "guest agent: " + p + ": file exists (exists, HTTP 409)", Code: "exists"})
			return
		}
		if _, ok := s.fileInfo(x.ID, path.Dir(p)); !ok && !parents {
			notFound(w, path.Dir(p))
			return
		}
		for q := p; q != "/"; q = path.Dir(q) {
			s.dirs[x.ID+":"+q] = true
		}
		fi, _ := s.fileInfo(x.ID, p)
		reply(w, 200, fi)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		p := r.URL.Query().Get("path")
		s.mu.Lock()
		defer s.mu.Unlock()
		fi, ok := s.fileInfo(x.ID, p)
		if !ok {
			notFound(w, p)
			return
		}
		inside := s.under(x.ID, p, 1<<30)
		if fi.IsDir && len(inside) > 0 && r.URL.Query().Get("recursive") != "1" {
			reply(w, 409, wire.Error{Error: "guest agent: " + p + ": directory not empty (not_empty, HTTP 409)", Code: "not_empty"})
			return
		}
		for _, q := range append(inside, p) {
			delete(s.files, x.ID+":"+q)
			delete(s.files, x.ID+":"+q+"#mode")
			delete(s.dirs, x.ID+":"+q)
		}
		reply(w, 200, map[string]string{"deleted": p})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/rename", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		var req wire.RenameRequest
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		defer s.mu.Unlock()
		b, ok := s.files[x.ID+":"+req.From]
		if !ok {
			notFound(w, req.From)
			return
		}
		delete(s.files, x.ID+":"+req.From)
		s.files[x.ID+":"+req.To] = b
		fi, _ := s.fileInfo(x.ID, req.To)
		reply(w, 200, fi)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/watch", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		p := r.URL.Query().Get("path")
		s.mu.Lock()
		fi, ok := s.fileInfo(x.ID, p)
		depth := 1
		if r.URL.Query().Get("recursive") == "1" {
			depth = 1 << 30
		}
		inside := s.under(x.ID, p, depth)
		s.mu.Unlock()
		if !ok || !fi.IsDir {
			notFound(w, p)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		now := time.Now().UTC()
		enc.Encode(wire.WatchEvent{Op: "ready", Path: p, IsDir: true, Time: now})
		for _, q := range inside {
			enc.Encode(wire.WatchEvent{Op: "create", Path: q, Time: now})
		}
	}))
}
