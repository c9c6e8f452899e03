package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/client/clienttest"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/vmmctl"
)

// stubClient starts a stand-in daemon and returns it with a client of it
// (over its unix socket) as tenant.
func stubClient(t *testing.T, tenant string) (*clienttest.Stub, *client.Client) {
	t.Helper()
	stub := clienttest.New(t)
	c, err := client.New(stub.Socket, tenant, "")
	if err != nil {
		t.Fatal(err)
	}
	return stub, c
}

func TestClientUnixSocket(t *testing.T) {
	_, c := stubClient(t, "")
	ctx := context.Background()
	if tenant, err := c.Health(ctx); err != nil || tenant != "default" {
		t.Fatalf("health: %q %v, want the default tenant", tenant, err)
	}
	var steps []wire.Progress
	tpl, err := c.CreateTemplate(ctx, wire.TemplateRequest{Kernel: "vmlinux"}, func(p wire.Progress) { steps = append(steps, p) })
	if err != nil || tpl.Status != "ready" || len(steps) != 3 || steps[0].Step != "booting the guest" || steps[2].Pct != 75 {
		t.Fatalf("template: %+v %v, progress %+v", tpl, err, steps)
	}
	if _, err := c.CreateTemplate(ctx, wire.TemplateRequest{}, nil); err == nil || !strings.Contains(err.Error(), "kernel is required") {
		t.Fatalf("template without kernel: %v", err)
	}
	sb, err := c.Create(ctx, wire.SandboxRequest{Template: tpl.ID, Labels: map[string]string{"name": "box"}}, nil)
	if err != nil || sb.Status != "running" {
		t.Fatalf("create: %+v %v", sb, err)
	}
	if _, err := c.Create(ctx, wire.SandboxRequest{Template: "tp-000000000999"}, nil); !client.IsNotFound(err) {
		t.Fatalf("create from a missing template: %v, want a 404", err)
	}
	if id, err := c.Resolve(ctx, "box"); err != nil || id != sb.ID {
		t.Fatalf("resolve box: %q %v", id, err)
	}
	if _, err := c.Resolve(ctx, "nobox"); !client.IsNotFound(err) {
		t.Fatalf("resolve nobox: %v", err)
	}
	var out, errOut bytes.Buffer
	st, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Argv: []string{"exit", "3"}, Stdin: []byte("in\n")}, &out, &errOut)
	if err != nil || st.Exit != 3 || out.String() != "exit 3\nin\n" || errOut.String() != "err\n" {
		t.Fatalf("exec: %+v %v stdout %q stderr %q", st, err, out.String(), errOut.String())
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/tmp/f", strings.NewReader("data"), 0o640); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if mode, err := c.ReadFile(ctx, sb.ID, "/tmp/f", &out); err != nil || mode != 0o640 || out.String() != "data" {
		t.Fatalf("read: %v %v %q", mode, err, out.String())
	}
	if _, err := c.ReadFile(ctx, sb.ID, "/nope", &out); !client.IsNotFound(err) {
		t.Fatalf("read a missing file: %v", err)
	}
	if s, err := c.Pause(ctx, sb.ID, false, nil); err != nil || s.Status != "paused" {
		t.Fatalf("pause: %+v %v", s, err)
	}
	var ce *client.Error
	if _, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Argv: []string{"true"}}, nil, nil); !errors.As(err, &ce) || ce.Status != 409 {
		t.Fatalf("exec in a paused sandbox: %v, want a 409", err)
	}
	if s, err := c.Resume(ctx, sb.ID, nil); err != nil || s.Status != "running" {
		t.Fatalf("resume: %+v %v", s, err)
	}
	n := 0
	if s, err := c.Pause(ctx, sb.ID, true, func(wire.Progress) { n++ }); err != nil || s.Status != "suspended" || n != 2 {
		t.Fatalf("pause to disk: %+v %v (%d steps)", s, err, n)
	}
	c.Resume(ctx, sb.ID, nil)
	snap, err := c.Snapshot(ctx, sb.ID, wire.SnapshotRequest{Name: "s1", Incremental: true})
	if err != nil || snap.Name != "s1" || snap.Kind != "incremental" {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	if r, err := c.SetRolling(ctx, sb.ID, 60e9, 4); err != nil || r == nil || r.Every != "1m0s" {
		t.Fatalf("rolling: %+v %v", r, err)
	}
	if r, err := c.SetRolling(ctx, sb.ID, 0, 0); err != nil || r != nil {
		t.Fatalf("rolling off: %+v %v", r, err)
	}
	if l, _, err := c.Snapshots(ctx, sb.ID); err != nil || len(l) != 1 {
		t.Fatalf("snapshots: %+v %v", l, err)
	}
	if rep, err := c.Rollback(ctx, sb.ID, "s1"); err != nil || rep.Snapshot != "s1" || rep.Line != "rolled back to s1" {
		t.Fatalf("rollback: %v %v", rep, err)
	}
	f, err := c.Fork(ctx, sb.ID, 2, nil)
	if err != nil || len(f.Children) != 2 || f.Children[0].Parent != sb.ID {
		t.Fatalf("fork: %+v %v", f, err)
	}
	if l, err := c.Sandboxes(ctx); err != nil || len(l) != 3 {
		t.Fatalf("sandboxes: %d %v", len(l), err)
	}
	var events []string
	if err := c.Events(ctx, func(e wire.Event) bool { events = append(events, e.Type); return len(events) < 2 }); err != nil || len(events) != 2 {
		t.Fatalf("events: %v %v", events, err)
	}
	if err := c.DeleteTemplate(ctx, tpl.ID); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("delete a template in use: %v", err)
	}
	for _, id := range []string{sb.ID, f.Children[0].ID, f.Children[1].ID} {
		if err := c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteTemplate(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sandbox(ctx, sb.ID); !client.IsNotFound(err) {
		t.Fatalf("deleted sandbox: %v", err)
	}
}

// Tenants: the header on the socket, the token on TCP.
func TestClientTenants(t *testing.T) {
	stub := clienttest.New(t)
	ctx := context.Background()
	a, _ := client.New("unix://"+stub.Socket, "alice", "")
	b, _ := client.New(stub.Socket, "bob", "")
	tpl, err := a.CreateTemplate(ctx, wire.TemplateRequest{Kernel: "vmlinux"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := b.Templates(ctx); err != nil || len(l) != 0 {
		t.Fatalf("bob sees %d templates (%v)", len(l), err)
	}
	if _, err := b.Create(ctx, wire.SandboxRequest{Template: tpl.ID}, nil); !client.IsNotFound(err) {
		t.Fatalf("bob uses alice's template: %v", err)
	}
	tc, err := client.New(stub.URL, "", stub.Token)
	if err != nil {
		t.Fatal(err)
	}
	if tenant, err := tc.Health(ctx); err != nil || tenant != "tok" {
		t.Fatalf("tcp health: %q %v", tenant, err)
	}
	bad, _ := client.New(stub.URL, "", "wrong-token-xxxxxxxx")
	if _, err := bad.Health(ctx); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("bad token: %v", err)
	}
	other, _ := client.New(stub.URL, "alice", stub.Token)
	if _, err := other.Health(ctx); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("token of another tenant: %v", err)
	}
	if _, err := client.New("http://", "", ""); err == nil {
		t.Fatal("bad address accepted")
	}
	none, _ := client.New(stub.Socket+".none", "", "")
	if _, err := none.Health(ctx); err == nil || !strings.Contains(err.Error(), "warren-hostd") {
		t.Fatalf("no daemon: %v", err)
	}
}

func TestClientSecretsAndEgress(t *testing.T) {
	stub, c := stubClient(t, "acme")
	ctx := context.Background()
	if err := c.SetSecret(ctx, "API_KEY", strings.NewReader("v1")); err != nil {
		t.Fatal(err)
	}
	if v, _ := stub.Secret("acme", "API_KEY"); v != "v1" {
		t.Errorf("the stub got %q", v)
	}
	if l, err := c.Secrets(ctx); err != nil || len(l) != 1 || l[0] != "API_KEY" {
		t.Errorf("secrets: %v %v", l, err)
	}
	tpl, err := c.CreateTemplate(ctx, wire.TemplateRequest{Kernel: "vmlinux", Network: true}, nil)
	if err != nil || !tpl.Network {
		t.Fatalf("template: %+v %v", tpl, err)
	}
	pol := json.RawMessage(`{"credentials":[{"secret":"API_KEY","hosts":["x.example.com"]}]}`)
	sb, err := c.Create(ctx, wire.SandboxRequest{Template: tpl.ID, Egress: pol, Secrets: []string{"API_KEY"}}, nil)
	if err != nil || !sb.Network {
		t.Fatalf("create: %+v %v", sb, err)
	}
	if r, err := c.Egress(ctx, sb.ID); err != nil || !bytes.Contains(r.Policy, []byte("x.example.com")) {
		t.Errorf("egress: %+v %v", r, err)
	}
	if r, err := c.SetEgress(ctx, sb.ID, json.RawMessage(`{"ipv6":true}`)); err != nil || string(r.Policy) != `{"ipv6":true}` {
		t.Errorf("set egress: %+v %v", r, err)
	}
	if err := c.DeleteSecret(ctx, "API_KEY"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSecret(ctx, "API_KEY"); !client.IsNotFound(err) {
		t.Errorf("second delete: %v, want a 404", err)
	}
}

func TestClientBalloon(t *testing.T) {
	_, c := stubClient(t, "acme")
	ctx := context.Background()
	tpl, err := c.CreateTemplate(ctx, wire.TemplateRequest{Kernel: "vmlinux", MemMiB: 128, Balloon: true}, nil)
	if err != nil || !tpl.Balloon {
		t.Fatalf("template: %+v %v", tpl, err)
	}
	sb, err := c.Create(ctx, wire.SandboxRequest{Template: tpl.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.Balloon(ctx, sb.ID); err != nil || r.TargetMiB != 0 || !r.FreePageReporting {
		t.Errorf("balloon: %+v %v", r, err)
	}
	target, interval := uint64(64), uint64(10)
	r, err := c.SetBalloon(ctx, sb.ID, vmmctl.BalloonRequest{TargetMiB: &target, StatsIntervalS: &interval})
	if err != nil || r.TargetMiB != 64 || r.StatsIntervalS != 10 {
		t.Errorf("set balloon: %+v %v", r, err)
	}
	if got, err := c.Sandbox(ctx, sb.ID); err != nil || got.BalloonTargetMiB == nil || *got.BalloonTargetMiB != 64 {
		t.Errorf("the sandbox after set balloon: %+v %v", got, err)
	}
	target = 129
	var ce *client.Error
	if _, err := c.SetBalloon(ctx, sb.ID, vmmctl.BalloonRequest{TargetMiB: &target}); !errors.As(err, &ce) || ce.Status != 400 {
		t.Errorf("a target above the guest's memory: %v, want a 400", err)
	}
	plainTpl, _ := c.CreateTemplate(ctx, wire.TemplateRequest{Kernel: "vmlinux"}, nil)
	plain, _ := c.Create(ctx, wire.SandboxRequest{Template: plainTpl.ID}, nil)
	if _, err := c.Balloon(ctx, plain.ID); !client.IsNotFound(err) || !strings.Contains(err.Error(), "has no balloon") {
		t.Errorf("balloon without one: %v, want a 404", err)
	}
}
