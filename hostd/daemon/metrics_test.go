package daemon

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/metrics"
	"github.com/warrenvm/warren/internal/kvmtest"
)

// TestMetrics checks what a Prometheus scrape of a daemon shows after a
// template build, a create and an API request: operation latencies by
// result, requests by route, sandboxes by status, and restores running and
// queued (with the one restore slot held and a create waiting for it).
func TestMetrics(t *testing.T) {
	var d *Daemon
	mx := metrics.New(metrics.Sources{LiveSandboxes: func() map[string]int { return d.StatusCounts() },
		Restores: func() (int, int) { return d.Restores() }})
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t), func(c *Config) { c.Observer = mx; c.MaxRestores = 1 })
	d = td.Daemon
	c := td.client(t, "acme")
	tp := c.template(fakeKernel(t))
	c.create(tp.ID)
	c.create(tp.ID)
	srv := httptest.NewServer(mx.Handler())
	defer srv.Close()
	scrape := func() string {
		res, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return string(b)
	}
	d.restores.acquire(context.Background(), nil) // the one slot
	created := make(chan struct{})
	go func() { c.create(tp.ID); close(created) }()
	kvmtest.WaitFor(t, 10*time.Second, "a create queued", func() bool {
		return strings.Contains(scrape(), "warren_restores_queued 1\n")
	})
	if b := scrape(); !strings.Contains(b, "warren_restores_running 1\n") {
		t.Errorf("scrape lacks warren_restores_running 1")
	}
	d.restores.release()
	<-created
	b := scrape()
	for _, want := range []string{
		"warren_restores_running 0\n",
		"warren_restores_queued 0\n",
		`warren_operation_duration_seconds_count{op="create",result="ok"} 3`,
		`warren_operation_duration_seconds_count{op="template_build",result="ok"} 1`,
		`warren_api_request_duration_seconds_count{method="POST",route="POST /v1/sandboxes",status="201"} 3`,
		`warren_sandboxes{status="running"} 3`,
	} {
		if !strings.Contains(b, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if t.Failed() {
		for _, l := range strings.Split(b, "\n") {
			if strings.HasPrefix(l, "warren_") && strings.Contains(l, "_count") || strings.HasPrefix(l, "warren_sandboxes") {
				t.Log(l)
			}
		}
	}
}
