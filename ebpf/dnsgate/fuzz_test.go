package dnsgate

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

// fuzzWriter is a dns.ResponseWriter that keeps what the gate writes.
type fuzzWriter struct {
	remote net.Addr
	msgs   []*dns.Msg
}

func (w *fuzzWriter) LocalAddr() net.Addr       { return &net.UDPAddr{IP: net.IPv4(192, 0, 2, 53), Port: 53} }
func (w *fuzzWriter) RemoteAddr() net.Addr      { return w.remote }
func (w *fuzzWriter) WriteMsg(m *dns.Msg) error { w.msgs = append(w.msgs, m); return nil }
func (w *fuzzWriter) Write([]byte) (int, error) { return 0, nil }
func (w *fuzzWriter) Close() error              { return nil }
func (w *fuzzWriter) TsigStatus() error         { return nil }
func (w *fuzzWriter) TsigTimersOnly(bool)       {}
func (w *fuzzWriter) Hijack()                   {}

// FuzzServeDNS sends the guest's resolver any message that parses (the
// first byte picks UDP or TCP) and checks each answer: exactly one reply,
// with the query's ID; over UDP, no bigger than the guest asked for (512
// bytes, or its EDNS size up to maxUDPReply); and no address in it that
// the policy's destination check refuses (loopback, private, link-local,
// unspecified: the upstream's zone has them for private.example.test).
func FuzzServeDNS(f *testing.F) {
	e := newEnv(f, nil)
	for _, q := range []struct {
		name  string
		qtype uint16
		edns  bool
	}{
		{"api.example.test.", dns.TypeA, false}, {"private.example.test.", dns.TypeA, true},
		{"cdn.example.test.", dns.TypeA, false}, {"x.wild.test.", dns.TypeAAAA, true},
		{"big.example.test.", dns.TypeA, false}, {"static.test.", dns.TypeA, false},
		{"denied.test.", dns.TypeTXT, false}, {"api.github.test.", dns.TypeA, false},
	} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		if q.edns {
			m.SetEdns0(4096, false)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(byte(0), b)
		f.Add(byte(1), b)
	}
	f.Fuzz(func(t *testing.T, via byte, data []byte) {
		r := new(dns.Msg)
		if r.Unpack(data) != nil {
			return // the server drops what does not parse
		}
		w := &fuzzWriter{remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 5353}}
		if via&1 != 0 {
			w.remote = &net.TCPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 5353}
		}
		e.gate.ServeDNS(w, r)
		if len(w.msgs) != 1 {
			t.Fatalf("%d replies to one query", len(w.msgs))
		}
		resp := w.msgs[0]
		if resp.Id != r.Id {
			t.Errorf("reply ID %d to query %d", resp.Id, r.Id)
		}
		if via&1 == 0 {
			limit := dns.MinMsgSize
			if opt := r.IsEdns0(); opt != nil {
				limit = min(max(int(opt.UDPSize()), dns.MinMsgSize), maxUDPReply)
			}
			if b, err := resp.Pack(); err == nil && len(b) > limit {
				t.Errorf("a UDP reply of %d bytes, the guest takes %d", len(b), limit)
			}
		}
		for _, rr := range append(append([]dns.RR{}, resp.Answer...), resp.Extra...) {
			a, typ := rrAddr(rr)
			if typ != 0 && a.IsValid() && !e.gate.destination(a) {
				t.Errorf("answer %v: an address the gate refuses as a destination", rr)
			}
		}
	})
}
