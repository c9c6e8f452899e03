package vmmctl

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// serve answers the control API on a unix socket with mux.
func serve(t *testing.T, mux *http.ServeMux) Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return Client{Socket: sock}
}

func TestClientRoundTrips(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/snapshot", func(w http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		d := json.NewDecoder(r.Body)
		d.DisallowUnknownFields()
		if err := d.Decode(&req); err != nil || req.Kind != vmsnap.Incremental {
			w.WriteHeader(400)
			json.NewEncoder(w).Encode(ErrorReply{Error: "bad request"})
			return
		}
		json.NewEncoder(w).Encode(SnapshotReply{Path: req.Path, Kind: string(req.Kind), Disks: []cow.DiskFiles{{Index: 0, Top: "/d/top"}}})
	})
	mux.HandleFunc("POST /v1/fork", func(w http.ResponseWriter, r *http.Request) {
		var req ForkRequest
		json.NewDecoder(r.Body).Decode(&req)
		rep := ForkReply{}
		for k := range req.N {
			rep.Children = append(rep.Children, ForkChild{Index: k, Hostname: "c", Disks: []cow.DiskFiles{}})
		}
		json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("POST /v1/rollback", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusConflict)
		json.NewEncoder(w).Encode(ErrorReply{Error: "the snapshot has no disk state"})
	})
	mux.HandleFunc("GET /v1/disks", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte("not json"))
	})
	mux.HandleFunc("GET /v1/egress", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"policy":{"rules":[]},"stats":` + strings.Repeat(" ", MaxReply) + `{}}`))
	})
	c := serve(t, mux)
	ctx := context.Background()

	s, err := c.Snapshot(ctx, SnapshotRequest{Path: "/s/x", Kind: vmsnap.Incremental})
	if err != nil || s.Path != "/s/x" || s.Kind != "incremental" || len(s.Disks) != 1 || s.Disks[0].Top != "/d/top" {
		t.Errorf("snapshot: %+v, %v", s, err)
	}
	f, err := c.Fork(ctx, ForkRequest{N: 3})
	if err != nil || len(f.Children) != 3 || f.Children[2].Index != 2 {
		t.Errorf("fork: %+v, %v", f, err)
	}
	_, err = c.Rollback(ctx, "/s/x")
	var ve *Error
	if !errors.As(err, &ve) || ve.Status != http.StatusConflict || ve.Message != "the snapshot has no disk state" {
		t.Errorf("a refused rollback: %v, want an *Error with 409 and the VMM's message", err)
	}
	if _, err = c.Disks(ctx); !errors.As(err, &ve) || ve.Status != 500 || !strings.Contains(ve.Message, "not json") {
		t.Errorf("a non-JSON refusal: %v", err)
	}
	if _, err := c.Egress(ctx); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an oversized answer: %v, want refused", err)
	}
	if _, err := c.SetEgress(ctx, []byte("{")); err == nil {
		t.Error("SetEgress sent a policy that is not JSON")
	}
	if err := (Client{Socket: filepath.Join(t.TempDir(), "none")}).Pause(ctx); err == nil || errors.As(err, &ve) {
		t.Errorf("no VMM: %v, want a dial error", err)
	}
}

func TestSetEgressFile(t *testing.T) {
	var got []byte
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/egress", func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(EgressReply{Policy: got, Stats: json.RawMessage(`{}`)})
	})
	c := serve(t, mux)
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Wildcard credential hosts pass the client's check (the VM has the last word).
	wild := `{"credentials": [{"secret": "K", "hosts": ["*.example.com"]}]}`
	if r, err := c.SetEgressFile(context.Background(), write("wild.json", wild)); err != nil || r.Policy == nil || string(got) != wild {
		t.Errorf("a wildcard policy: %+v %v, sent %q", r, err, got)
	}
	got = nil
	for name, data := range map[string]string{"unknown.json": `{"nope": 1}`, "bad.json": `{`} {
		if _, err := c.SetEgressFile(context.Background(), write(name, data)); err == nil || !strings.Contains(err.Error(), "egress policy") || got != nil {
			t.Errorf("%s: %v, want refused before sending", name, err)
		}
	}
	if _, err := c.SetEgressFile(context.Background(), filepath.Join(dir, "none")); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}
