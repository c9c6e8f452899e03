package daemon

import (
	"sync"
	"time"

	"github.com/warrenvm/warren/hostd/wire"
)

// bus fans a tenant's events out to that tenant's subscribers only.
type bus struct {
	mu   sync.Mutex
	subs map[string]map[chan wire.Event]struct{}
}

func newBus() *bus { return &bus{subs: map[string]map[chan wire.Event]struct{}{}} }

func (b *bus) subscribe(tenant string) (chan wire.Event, func()) {
	ch := make(chan wire.Event, 256)
	b.mu.Lock()
	if b.subs[tenant] == nil {
		b.subs[tenant] = map[chan wire.Event]struct{}{}
	}
	b.subs[tenant][ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		delete(b.subs[tenant], ch)
		b.mu.Unlock()
	}
}

// publish delivers e to tenant's subscribers; a subscriber whose buffer is
// full misses it (it never blocks the daemon).
func (b *bus) publish(tenant string, e wire.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs[tenant] {
		select {
		case ch <- e:
		default:
		}
	}
}
