package daemon

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"

	"github.com/warrenvm/warren/hostd/wire"
)

// An op is a long operation (template build, sandbox create, fork, resume
// from disk, pause to disk) running on its own goroutine: a client that
// disconnects does not cut it short. Its progress goes to the request
// that started it, as NDJSON lines when the client asked for
// application/x-ndjson:
//
//	{"progress": "booting the guest", "pct": 10}
//	...
//	{"result": {...}, "status": 201}   or   {"error": "...", "status": 500}
//
// (wire.Progress lines, then a wire.Result or a wire.Error), and
// otherwise as one JSON answer at the end.
type op struct {
	mu       sync.Mutex
	ch       chan wire.Progress
	done     chan struct{}
	status   int
	result   any
	err      error
	finished bool
	// from, when set, maps the percentages reported after it into
	// [from, 100] (an op with a first phase of its own before the usual
	// steps: an image template's base build). Set by the op's goroutine
	// only, between progress calls.
	from int
	// scope, when set (scoped), prefixes the steps reported meanwhile
	// and maps their percentages into [lo, hi] before from applies: a
	// phase that reports its own steps, 0 to 100, as part of the op's
	// (a build's working-set recording). Set by the op's goroutine only.
	scope *stepScope
}

// stepScope is an op's current phase (op.scope).
type stepScope struct {
	prefix string
	lo, hi int
}

// scoped makes o's steps, until the returned func is called, those of a
// phase: each prefixed and its percentage mapped into [lo, hi].
func (o *op) scoped(prefix string, lo, hi int) (end func()) {
	o.scope = &stepScope{prefix, lo, hi}
	return func() { o.scope = nil }
}

func newOp() *op { return &op{ch: make(chan wire.Progress, 64), done: make(chan struct{})} }

// progress reports a step; dropped when nobody reads fast enough.
func (o *op) progress(msg string, pct int) {
	if sc := o.scope; sc != nil {
		msg, pct = sc.prefix+msg, sc.lo+min(max(pct, 0), 100)*(sc.hi-sc.lo)/100
	}
	if o.from > 0 {
		pct = o.from + pct*(100-o.from)/100
	}
	select {
	case o.ch <- wire.Progress{Step: msg, Pct: pct}:
	default:
	}
}

// finish ends the op with a result (status 2xx) or an error.
func (o *op) finish(status int, result any, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.finished {
		return
	}
	o.finished = true
	o.status, o.result, o.err = status, result, err
	close(o.done)
}

func wantsStream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
}

// run starts fn on its own goroutine and answers r with its progress and
// outcome.
func (o *op) run(w http.ResponseWriter, r *http.Request, fn func(o *op) (int, any, error)) {
	go func() {
		status, res, err := fn(o)
		o.finish(status, res, err)
	}()
	if !wantsStream(r) {
		select {
		case <-o.done:
		case <-r.Context().Done():
			return
		}
		if o.err != nil {
			writeErr(w, o.err)
			return
		}
		writeJSON(w, o.status, o.result)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	fl, _ := w.(http.Flusher)
	flush := func() {
		if fl != nil {
			fl.Flush()
		}
	}
	flush()
	for {
		select {
		case p := <-o.ch:
			enc.Encode(p)
			flush()
		case <-o.done:
			// Drain the progress already reported.
			for {
				select {
				case p := <-o.ch:
					enc.Encode(p)
					continue
				default:
				}
				break
			}
			if o.err != nil {
				st, msg := errStatus(o.err)
				enc.Encode(wire.Error{Error: msg, Status: st})
			} else {
				enc.Encode(wire.Result{Result: o.result, Status: o.status})
			}
			flush()
			return
		case <-r.Context().Done():
			return
		}
	}
}
