package kube

import (
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
)

// TestBuildLocks: one template generation's work is serialized, and the
// lock's entry is gone once its last user is done, so the map does not
// grow with every generation a tenant makes.
func TestBuildLocks(t *testing.T) {
	a := &Agent{building: map[string]*buildLock{}, templates: map[string]hostTemplate{}}
	var mu sync.Mutex
	inside, most := 0, 0
	var wg sync.WaitGroup
	for i := range 8 {
		key := "team-a/tiny@1"
		if i%2 == 1 {
			key = "team-a/tiny@2"
		}
		wg.Go(func() {
			release := a.lockBuild(key)
			defer release()
			if key != "team-a/tiny@1" {
				return
			}
			mu.Lock()
			inside++
			most = max(most, inside)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			mu.Lock()
			inside--
			mu.Unlock()
		})
	}
	wg.Wait()
	if most != 1 {
		t.Fatalf("%d goroutines held one generation's lock at once", most)
	}
	if len(a.building) != 0 {
		t.Fatalf("build locks left after their users: %v", a.building)
	}
}

// TestRememberReplacesOlderGeneration: a template's newer generation
// replaces the older one's entry.
func TestRememberReplacesOlderGeneration(t *testing.T) {
	a := &Agent{building: map[string]*buildLock{}, templates: map[string]hostTemplate{}}
	for gen := int64(1); gen <= 50; gen++ {
		a.remember(&v1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "tiny", Generation: gen}}, "tp-x")
	}
	if len(a.templates) != 1 || a.templates["team-a/tiny"].generation != 50 {
		t.Fatalf("templates %v, want one entry at generation 50", a.templates)
	}
}
