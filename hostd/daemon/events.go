package daemon

import (
	"sync"
	"time"
)

// Event is one lifecycle event of a tenant's sandbox or template.
type Event struct {
	Time     time.Time `json:"time"`
	Type     string    `json:"type"` // created, paused, resumed, snapshotted, forked, rolled_back, stopped, deleted, template_ready, template_failed, key_created, key_revoked
	Sandbox  string    `json:"sandbox,omitempty"`
	Template string    `json:"template,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

// bus fans a tenant's events out to that tenant's subscribers only.
type bus struct {
	mu   sync.Mutex
	subs map[string]map[chan Event]struct{}
}

func newBus() *bus { return &bus{subs: map[string]map[chan Event]struct{}{}} }

func (b *bus) subscribe(tenant string) (chan Event, func()) {
	ch := make(chan Event, 256)
	b.mu.Lock()
	if b.subs[tenant] == nil {
		b.subs[tenant] = map[chan Event]struct{}{}
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
func (b *bus) publish(tenant string, e Event) {
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
