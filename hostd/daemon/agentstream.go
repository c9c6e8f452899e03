package daemon

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/warrenvm/warren/agentclient"
)

// Helpers of the handlers that pass a request on to a sandbox's guest agent
// and stream its answer (processes.go, guestfileops.go).

// disturbed returns ctx, cancelled (with the reason as its cause) when
// something happens to sandbox s that breaks or rewinds its agent's
// connections: a rollback (the guest's memory, its agent's connections
// included, goes back to a snapshot's), a pause to disk, a stop or a
// delete, or the daemon's own stop. A stream following the agent then ends
// rather than wait on a connection that may never say more; the client
// comes back, from the offset it reached. An in-memory pause does not end
// it: the stream stalls with the guest and goes on at its resume. stop
// releases what disturbed holds.
func (d *Daemon) disturbed(ctx context.Context, s *sbState) (context.Context, context.CancelFunc) {
	rec := d.snapshotRec(s)
	ch, unsubscribe := d.events.subscribe(rec.Tenant)
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		defer unsubscribe()
		for {
			select {
			case e := <-ch:
				if e.Sandbox != rec.ID {
					continue
				}
				switch {
				case e.Type == "rolled_back", e.Type == "stopped", e.Type == "deleted",
					e.Type == "paused" && strings.HasPrefix(e.Detail, "to disk"):
					cancel(fmt.Errorf("sandbox %s was %s: reconnect", rec.ID, strings.ReplaceAll(e.Type, "_", " ")))
					return
				}
			case <-d.ctx.Done():
				cancel(fmt.Errorf("the daemon is stopping"))
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, func() { cancel(nil) }
}

// agentErrOrNil is agentErr for an error, nil for none.
func agentErrOrNil(err error) error {
	if err == nil {
		return nil
	}
	return agentErr(err)
}

// queryBool reads the query parameter name as a boolean ("1", "true",
// "0", "false", ...); absent is def, anything else a 400.
func queryBool(r *http.Request, name string, def bool) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(strings.ToLower(v))
	if err != nil {
		return false, errf(400, "bad %s %q: want 0 or 1", name, v)
	}
	return b, nil
}

// askAgent answers a call of one reply: bad (a refusal of the request
// found before the agent is asked) when it is not nil, else what ask gets
// from the sandbox's ready agent (200), or the agent's error as agentErr
// makes it. A list ask returns goes through nonNil first.
func (d *Daemon) askAgent(w http.ResponseWriter, s *sbState, bad error, ask func(c *agentclient.Client) (any, error)) {
	if bad != nil {
		writeErr(w, bad)
		return
	}
	c, _, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	v, err := ask(c)
	reply(w, 200, v, agentErrOrNil(err))
}

// query reads a request's query parameters, keeping the first one refused
// (a 400) in err.
type query struct {
	r   *http.Request
	err error
}

func (q *query) keep(err error) {
	if q.err == nil {
		q.err = err
	}
}

// path is parameter name, an absolute guest path (guestPath).
func (q *query) path(name string) string {
	p, err := guestPath(q.r, name)
	q.keep(err)
	return p
}

// flag is parameter name as a boolean (queryBool), def when absent.
func (q *query) flag(name string, def bool) bool {
	b, err := queryBool(q.r, name, def)
	q.keep(err)
	return b
}
