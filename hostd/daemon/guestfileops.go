package daemon

import (
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"
	"strings"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/wire"
)

// The file API beyond download and upload (api.go's getFile, putFile):
// listing, stat, mkdir, remove, rename and watching a sandbox's guest
// files, passed on to its agent. Paths are the guest's and must be
// absolute; the agent resolves them in the guest (the guest's files are
// the tenant's own), so the daemon checks only their form and the bounds
// of what it asks. Like exec, no handler holds the sandbox's lock while
// the agent answers.

// fileRoutes registers the file API's routes.
func (d *Daemon) fileRoutes(handle func(string, handlerFunc)) {
	handle("GET /v1/sandboxes/{id}/files/list", d.withSandbox(d.listFiles))
	handle("GET /v1/sandboxes/{id}/files/stat", d.withSandbox(d.statFile))
	handle("POST /v1/sandboxes/{id}/files/mkdir", d.withSandbox(d.mkdir))
	handle("DELETE /v1/sandboxes/{id}/files", d.withSandbox(d.removeFile))
	handle("POST /v1/sandboxes/{id}/files/rename", d.withSandbox(withBody(d.renameFile)))
	handle("GET /v1/sandboxes/{id}/files/watch", d.withSandbox(d.watchFiles))
}

// guestPath returns the query parameter name, which must be an absolute
// guest path.
func guestPath(r *http.Request, name string) (string, error) {
	return checkGuestPath(name, r.URL.Query().Get(name))
}

// checkGuestPath refuses (400) a path that is not absolute or holds a NUL.
func checkGuestPath(what, p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", errf(400, "%s must be an absolute guest path", what)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errf(400, "%s holds a NUL byte", what)
	}
	return p, nil
}

func (d *Daemon) listFiles(w http.ResponseWriter, r *http.Request, s *sbState) {
	q := query{r: r}
	p := q.path("path")
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > agentwire.MaxListDepth {
			q.keep(errf(400, "bad depth %q: want 1 to %d", v, agentwire.MaxListDepth))
		}
		depth = n
	}
	d.askAgent(w, s, q.err, func(c *agentclient.Client) (any, error) {
		l, err := c.ListDepth(r.Context(), p, depth)
		return nonNil(l), err
	})
}

func (d *Daemon) statFile(w http.ResponseWriter, r *http.Request, s *sbState) {
	q := query{r: r}
	p := q.path("path")
	d.askAgent(w, s, q.err, func(c *agentclient.Client) (any, error) { return c.Stat(r.Context(), p) })
}

func (d *Daemon) mkdir(w http.ResponseWriter, r *http.Request, s *sbState) {
	q := query{r: r}
	p, parents := q.path("path"), q.flag("parents", false)
	mode := uint64(0o755)
	if m := r.URL.Query().Get("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o777 {
			q.keep(errf(400, "bad mode %q: want octal permissions, at most 777", m))
		}
	}
	d.askAgent(w, s, q.err, func(c *agentclient.Client) (any, error) {
		return c.Mkdir(r.Context(), p, fs.FileMode(mode), parents)
	})
}

func (d *Daemon) removeFile(w http.ResponseWriter, r *http.Request, s *sbState) {
	q := query{r: r}
	p, recursive := q.path("path"), q.flag("recursive", false)
	d.askAgent(w, s, q.err, func(c *agentclient.Client) (any, error) {
		return map[string]string{"deleted": p}, c.Remove(r.Context(), p, recursive)
	})
}

func (d *Daemon) renameFile(w http.ResponseWriter, r *http.Request, s *sbState, req wire.RenameRequest) {
	_, bad := checkGuestPath("from", req.From)
	if bad == nil {
		_, bad = checkGuestPath("to", req.To)
	}
	d.askAgent(w, s, bad, func(c *agentclient.Client) (any, error) { return c.Rename(r.Context(), req.From, req.To) })
}

// watchFiles streams the agent's WatchEvents as NDJSON, each flushed as it
// comes, until the client goes away, the agent ends the stream or the
// sandbox is disturbed; the first is Op "ready". The answer's header goes
// out with the first event, so an agent's refusal (no such directory) is
// answered with its status; a stream that broke after that ends with a
// line {"error": "..."}.
func (d *Daemon) watchFiles(w http.ResponseWriter, r *http.Request, s *sbState) {
	q := query{r: r}
	p, recursive := q.path("path"), q.flag("recursive", false)
	if q.err != nil {
		writeErr(w, q.err)
		return
	}
	c, _, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	ctx, stop := d.disturbed(r.Context(), s)
	defer stop()
	var enc *json.Encoder
	fl, _ := w.(http.Flusher)
	err = c.Watch(ctx, p, recursive, func(ev agentwire.WatchEvent) bool {
		if enc == nil {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(200)
			enc = json.NewEncoder(w)
		}
		if enc.Encode(ev) != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	})
	if err == nil || r.Context().Err() != nil {
		return
	}
	if cause := context.Cause(ctx); ctx.Err() != nil && cause != nil {
		err = cause
	}
	if enc == nil {
		writeErr(w, agentErr(err))
		return
	}
	enc.Encode(wire.Error{Error: err.Error()})
	if fl != nil {
		fl.Flush()
	}
}
