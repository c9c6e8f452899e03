// Package audit writes a sandbox's egress decisions (packet filter,
// resolver and credential proxy) as JSON lines, one file per sandbox,
// with a rate limit so that a guest flooding denied packets cannot fill the
// host's disk or burn its CPU: past the limit, records are counted, not
// written, and the count is written as one "suppressed" record when
// writing resumes. The file is also capped in size (a guest within the
// rate still writes gigabytes a day): past MaxBytes it rotates to FILE.1,
// one older generation kept (internal/logcap), whole lines in each.
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/warrenvm/warren/internal/logcap"
)

// Sources of records.
const (
	SourceFilter = "filter" // the eBPF packet filter on the tap
	SourceDNS    = "dns"    // the sandbox's resolver
	SourceProxy  = "proxy"  // the credential proxy
	SourcePolicy = "policy" // a policy change
	SourceAudit  = "audit"  // the log itself (suppressed counts)
)

// Verdicts.
const (
	Allow = "allow"
	Deny  = "deny"
)

// Record is one decision. Fields that do not apply are left empty.
type Record struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox,omitempty"`
	Source  string    `json:"source"`
	Verdict string    `json:"verdict,omitempty"`
	// Packet fields (filter): protocol name, addresses and ports.
	Proto   string `json:"proto,omitempty"`
	Src     string `json:"src,omitempty"`
	Dst     string `json:"dst,omitempty"`
	SrcPort uint16 `json:"sport,omitempty"`
	DstPort uint16 `json:"dport,omitempty"`
	// RuleID is the policy rule or domain id that allowed the packet, or
	// an infrastructure id (see ebpf/filter); 0 for the default deny.
	RuleID uint32 `json:"rule,omitempty"`
	// Reason says why, in a word: "no-rule", "port", "spoofed-source", ...
	Reason string `json:"reason,omitempty"`
	// Name is a DNS name (dns) or the request's host (proxy).
	Name string `json:"name,omitempty"`
	// Addrs are the addresses a DNS answer allowed.
	Addrs []string `json:"addrs,omitempty"`
	// Method and Path of a proxied request; Credential is the secret name
	// substituted, if any.
	Method     string `json:"method,omitempty"`
	Path       string `json:"path,omitempty"`
	Credential string `json:"credential,omitempty"`
	Status     int    `json:"status,omitempty"`
	// Count is the number of records a "suppressed" record stands for.
	Count uint64 `json:"count,omitempty"`
	// Detail is free text (errors, policy summaries).
	Detail string `json:"detail,omitempty"`
}

// Recorder takes records. *Log implements it; tests use Memory.
type Recorder interface {
	Record(Record)
}

// Discard is a Recorder that drops everything.
type Discard struct{}

// Record drops r.
func (Discard) Record(Record) {}

// Memory is a Recorder that keeps every record in memory, for tests. It
// is safe for concurrent use; the zero value is empty and ready.
type Memory struct {
	mu   sync.Mutex
	recs []Record
}

// Record keeps r.
func (m *Memory) Record(r Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, r)
}

// Records returns a copy of the records kept, oldest first.
func (m *Memory) Records() []Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Record(nil), m.recs...)
}

// Default rate limit: a sustained 200 records a second with bursts of 1000.
const (
	DefaultRate  = 200
	DefaultBurst = 1000
	// DefaultMaxBytes is each generation's size cap (16 MiB: 32 MiB of
	// audit log per sandbox at most).
	DefaultMaxBytes = 16 << 20
)

// Log is a rate-limited JSON-lines audit log. It is safe for concurrent use;
// mu guards every field.
type Log struct {
	mu         sync.Mutex
	f          *logcap.Rotating
	w          *bufio.Writer // over f; flushed before a record would not fit, so f gets whole lines
	sandbox    string
	rate       float64 // tokens per second
	burst      float64
	tokens     float64
	last       time.Time
	suppressed uint64
	written    uint64
	now        func() time.Time
	flushTimer *time.Timer
	closed     bool
}

// Open appends to the audit log at path (created 0600, with path.1, the
// older generation) for sandbox, with the given rate limit (records per
// second and burst) and size cap per generation (0 takes the defaults).
func Open(path, sandbox string, rate, burst int, maxBytes int64) (*Log, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	f, err := logcap.Append(path, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	if rate <= 0 {
		rate = DefaultRate
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	return &Log{f: f, w: bufio.NewWriterSize(f, 64<<10), sandbox: sandbox, rate: float64(rate),
		burst: float64(burst), tokens: float64(burst), now: time.Now}, nil
}

// Record writes r (stamping its time and sandbox when empty) unless the
// rate limit is exceeded, in which case it is counted. Writes are
// buffered and flushed within 100 ms.
func (l *Log) Record(r Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	now := l.now()
	if !l.last.IsZero() {
		l.tokens += now.Sub(l.last).Seconds() * l.rate
		if l.tokens > l.burst {
			l.tokens = l.burst
		}
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		return
	}
	l.tokens--
	if l.suppressed > 0 {
		l.writeLocked(Record{Time: now, Source: SourceAudit, Reason: "suppressed", Count: l.suppressed,
			Detail: "records over the rate limit were counted, not written"})
		l.suppressed = 0
	}
	if r.Time.IsZero() {
		r.Time = now
	}
	l.writeLocked(r)
	if l.flushTimer == nil {
		l.flushTimer = time.AfterFunc(100*time.Millisecond, l.timedFlush)
	}
}

func (l *Log) writeLocked(r Record) {
	if r.Sandbox == "" {
		r.Sandbox = l.sandbox
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	b = append(b, '\n')
	if len(b) > l.w.Available() {
		// A line never spans two writes to the file (nor two generations).
		l.w.Flush()
	}
	l.w.Write(b)
	l.written++
}

func (l *Log) timedFlush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushTimer = nil
	if !l.closed {
		l.w.Flush()
	}
}

// Flush writes buffered records to the file.
func (l *Log) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	return l.w.Flush()
}

// Stats returns how many records were written and how many are being
// suppressed now.
func (l *Log) Stats() (written, suppressed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.written, l.suppressed
}

// Close writes any pending suppressed count, flushes and closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	if l.suppressed > 0 {
		l.writeLocked(Record{Time: l.now(), Source: SourceAudit, Reason: "suppressed", Count: l.suppressed})
		l.suppressed = 0
	}
	l.closed = true
	if l.flushTimer != nil {
		l.flushTimer.Stop()
	}
	err := l.w.Flush()
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	return err
}
