// Package metrics exports the host daemon's measurements in the Prometheus
// text format (GET /metrics): API request latency, operation latency
// (template build, create, fork, restore, snapshot, exec), live sandboxes,
// restores running and queued, snapshot bytes written and egress packets
// denied.
//
// A Metrics is safe for concurrent use; the gauges' callbacks are called
// on each scrape, from the scraping goroutine.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Sources are the callbacks the gauges read at each scrape. Nil ones
// export nothing.
type Sources struct {
	// LiveSandboxes counts sandboxes by status ("running", "paused", ...).
	LiveSandboxes func() map[string]int
	// EgressDenied is the total of packets the sandboxes' egress filters
	// denied, since each filter was loaded.
	EgressDenied func() float64
	// Restores reports the restores under way (holding an admission
	// slot) and those queued for one.
	Restores func() (running, queued int)
}

// Metrics is the daemon's registry.
type Metrics struct {
	reg           *prometheus.Registry
	requests      *prometheus.HistogramVec
	ops           *prometheus.HistogramVec
	snapshotBytes prometheus.Counter
}

// Latency buckets, seconds: 5 ms to about 5 min, since operations here run
// from milliseconds (exec, pause) to minutes (a template build under
// emulation).
var buckets = prometheus.ExponentialBuckets(0.005, 2, 17)

// New registers the daemon's metrics (and the Go runtime's and process's).
func New(src Sources) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "warren_api_request_duration_seconds", Help: "API requests by method, route and status.",
		Buckets: buckets}, []string{"method", "route", "status"})
	m.ops = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "warren_operation_duration_seconds", Help: "Sandbox operations (template_build, create, fork, resume_from_disk, pause_to_disk, snapshot, exec) by result.",
		Buckets: buckets}, []string{"op", "result"})
	m.snapshotBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "warren_snapshot_bytes_total", Help: "Bytes of snapshot files written (state and memory layers)."})
	m.reg.MustRegister(m.requests, m.ops, m.snapshotBytes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if src.LiveSandboxes != nil {
		m.reg.MustRegister(&liveCollector{f: src.LiveSandboxes,
			desc: prometheus.NewDesc("warren_sandboxes", "Sandboxes known to the daemon, by status.", []string{"status"}, nil)})
	}
	if src.EgressDenied != nil {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "warren_egress_denied_packets_total", Help: "Packets the sandboxes' egress filters denied."}, src.EgressDenied))
	}
	if f := src.Restores; f != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "warren_restores_running", Help: "VMMs restoring now (admission slots in use: from start to the guest agent's answer)."},
			func() float64 { r, _ := f(); return float64(r) }))
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "warren_restores_queued", Help: "Creates and resumes waiting for an admission slot."},
			func() float64 { _, q := f(); return float64(q) }))
	}
	return m
}

// ObserveRequest records one API request (the daemon's Observer).
func (m *Metrics) ObserveRequest(tenant, method, route string, status int, d time.Duration) {
	m.requests.WithLabelValues(method, route, strconv.Itoa(status)).Observe(d.Seconds())
}

// ObserveOp records one operation's latency and result.
func (m *Metrics) ObserveOp(op string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.ops.WithLabelValues(op, result).Observe(d.Seconds())
}

// AddSnapshotBytes counts n bytes of snapshot files written.
func (m *Metrics) AddSnapshotBytes(n int64) { m.snapshotBytes.Add(float64(n)) }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// liveCollector exports a status -> count map as one gauge per status.
type liveCollector struct {
	f    func() map[string]int
	desc *prometheus.Desc
}

func (c *liveCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *liveCollector) Collect(ch chan<- prometheus.Metric) {
	for status, n := range c.f() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), status)
	}
}
