package kube

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/warrenvm/warren/hostd/store"
)

// Entry is one VM this host made for a Sandbox.
type Entry struct {
	// UID, Namespace and Name are the Sandbox's; ID is the daemon's
	// sandbox id (the tenant is Namespace).
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	ID        string `json:"id"`
}

// journal is the host's record of its VMs, in STATE/kube/journal.json,
// rewritten atomically on each change (store.WriteJSON), so that a crash
// leaves the previous or the next version. An entry is written with no
// ID before its VM is created (with the Sandbox's UID as a daemon label,
// LabelUID) and gets the ID after: a crash between the two leaves an
// entry the sweep resolves by that label, so no VM is ever unrecorded.
type journal struct {
	path string
	// mu guards entries, keyed by UID.
	mu      sync.Mutex
	entries map[string]Entry
}

// maxJournalBytes bounds the journal file read back.
const maxJournalBytes = 64 << 20

func openJournal(stateDir string) (*journal, error) {
	dir := filepath.Join(stateDir, "kube")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	j := &journal{path: filepath.Join(dir, "journal.json"), entries: map[string]Entry{}}
	b, err := os.ReadFile(j.path)
	if os.IsNotExist(err) {
		return j, nil
	}
	if err != nil {
		return nil, err
	}
	if len(b) > maxJournalBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", j.path, len(b), maxJournalBytes)
	}
	var l []Entry
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", j.path, err)
	}
	for _, e := range l {
		j.entries[e.UID] = e
	}
	return j, nil
}

// save writes the journal; the caller holds mu.
func (j *journal) save() error {
	l := slices.SortedFunc(maps.Values(j.entries), func(a, b Entry) int { return cmp.Compare(a.UID, b.UID) })
	return store.WriteJSON(j.path, l)
}

// put records e.
func (j *journal) put(e Entry) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.entries[e.UID] = e
	return j.save()
}

// drop forgets uid.
func (j *journal) drop(uid string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.entries[uid]; !ok {
		return nil
	}
	delete(j.entries, uid)
	return j.save()
}

// get returns uid's entry.
func (j *journal) get(uid string) (Entry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.entries[uid]
	return e, ok
}

// byName returns the entries of namespace/name (one, or more when the
// Sandbox was deleted and made again under the same name).
func (j *journal) byName(ns, name string) []Entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []Entry
	for _, e := range j.entries {
		if e.Namespace == ns && e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// all returns every entry.
func (j *journal) all() []Entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Collect(maps.Values(j.entries))
}

// count is the number of VMs the host holds for the fleet.
func (j *journal) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.entries)
}
