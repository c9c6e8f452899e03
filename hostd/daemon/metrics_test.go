package daemon

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/metrics"
)

// TestMetrics checks what a Prometheus scrape of a daemon shows after a
// template build, a create and an API request: operation latencies by
// result, requests by route, and sandboxes by status.
func TestMetrics(t *testing.T) {
	var d *Daemon
	mx := metrics.New(metrics.Sources{LiveSandboxes: func() map[string]int { return d.StatusCounts() }})
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t), func(c *Config) { c.Observer = mx })
	d = td.Daemon
	c := td.client(t, "acme")
	tp := c.template(fakeKernel(t))
	c.create(tp.ID)
	c.create(tp.ID)
	srv := httptest.NewServer(mx.Handler())
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`warren_operation_duration_seconds_count{op="create",result="ok"} 2`,
		`warren_operation_duration_seconds_count{op="template_build",result="ok"} 1`,
		`warren_api_request_duration_seconds_count{method="POST",route="POST /v1/sandboxes",status="201"} 2`,
		`warren_sandboxes{status="running"} 2`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if t.Failed() {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "warren_") && strings.Contains(l, "_count") || strings.HasPrefix(l, "warren_sandboxes") {
				t.Log(l)
			}
		}
	}
}
