package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestExposition(t *testing.T) {
	m := New(Sources{
		LiveSandboxes: func() map[string]int { return map[string]int{"running": 3, "paused": 1} },
		EgressDenied:  func() float64 { return 42 },
	})
	m.ObserveRequest("acme", "POST", "/v1/sandboxes", 200, 80*time.Millisecond)
	m.ObserveOp("create", 60*time.Millisecond, nil)
	m.ObserveOp("create", 2*time.Second, errors.New("boom"))
	m.ObserveOp("fork", 300*time.Millisecond, nil)
	m.AddSnapshotBytes(4096)

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	text := string(b)
	for _, want := range []string{
		`warren_api_request_duration_seconds_count{method="POST",route="/v1/sandboxes",status="200"} 1`,
		`warren_operation_duration_seconds_count{op="create",result="ok"} 1`,
		`warren_operation_duration_seconds_count{op="create",result="error"} 1`,
		`warren_operation_duration_seconds_bucket{op="fork",result="ok",le="0.32"} 1`,
		`warren_snapshot_bytes_total 4096`,
		`warren_sandboxes{status="running"} 3`,
		`warren_sandboxes{status="paused"} 1`,
		`warren_egress_denied_packets_total 42`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
	if strings.Contains(text, "acme") {
		t.Error("a tenant name is in the metrics (they are host-wide, not per tenant)")
	}
}
