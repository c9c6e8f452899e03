// Package agentdial dials the guest agent of a VM that is still being
// restored or forked, for Warren's benchmarks.
package agentdial

import (
	"context"
	"net"
	"time"

	"github.com/warrenvm/warren/agentclient"
)

// Racing returns a DialFunc that starts a new attempt of dial every 5 ms
// (at most 8 at once) until one connects, so that an attempt the guest
// will never answer (made while it was being restored) does not delay the
// first that it does.
func Racing(dial agentclient.DialFunc) agentclient.DialFunc {
	return func(ctx context.Context) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		actx, cancel := context.WithCancel(ctx)
		results := make(chan result, 8)
		inflight := 0
		launch := func() {
			inflight++
			go func() {
				c, err := dial(actx)
				results <- result{c, err}
			}()
		}
		finish := func() {
			cancel()
			go func(n int) { // close what lands after
				for ; n > 0; n-- {
					if r := <-results; r.c != nil {
						r.c.Close()
					}
				}
			}(inflight)
		}
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		launch()
		var last error
		for {
			select {
			case r := <-results:
				inflight--
				if r.err == nil {
					finish()
					return r.c, nil
				}
				last = r.err
			case <-tick.C:
				if inflight < 8 {
					launch()
				}
			case <-ctx.Done():
				finish()
				if last == nil {
					last = ctx.Err()
				}
				return nil, last
			}
		}
	}
}
