package wire

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
)

// TestJSON pins each body's bytes: a changed name or order is a changed
// wire. The replies the daemon used to write as maps are checked against
// those maps too.
func TestJSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	code := 3
	rolling := &store.Rolling{Every: "1m0s", Keep: 8}
	for _, tc := range []struct {
		name   string
		v      any
		want   string
		oldMap any // the map the daemon wrote before, if it did
	}{
		{"TemplateRequest", TemplateRequest{Kernel: "vmlinux", Initramfs: "initramfs.cpio", Disks: []string{"data.img,ro"}, MemMiB: 256, CPUs: 2, Cmdline: "quiet"},
			`{"kernel":"vmlinux","initramfs":"initramfs.cpio","disks":["data.img,ro"],"mem_mib":256,"cpus":2,"cmdline":"quiet"}`, nil},
		{"TemplateRequest empty", TemplateRequest{}, `{}`, nil},
		{"TemplateRequest image", TemplateRequest{Image: "r/x:1", InsecureRegistry: true, DiskMiB: 2048, StartCmd: "s", ReadyCmd: "r"},
			`{"image":"r/x:1","insecure_registry":true,"disk_mib":2048,"start_cmd":"s","ready_cmd":"r"}`, nil},
		{"TemplateRequest network", TemplateRequest{Kernel: "vmlinux", Network: true}, `{"kernel":"vmlinux","network":true}`, nil},
		{"TemplateRequest balloon", TemplateRequest{Kernel: "vmlinux", Balloon: true}, `{"kernel":"vmlinux","balloon":true}`, nil},
		{"Secret", Secret{Name: "API_KEY"}, `{"name":"API_KEY"}`, nil},
		{"SecretList", SecretList{Names: []string{}}, `{"names":[]}`, nil},
		{"EgressReply", EgressReply{Policy: json.RawMessage(`{}`), Stats: json.RawMessage(`{"passed":1}`), Audit: "/a"},
			`{"policy":{},"stats":{"passed":1},"audit":"/a"}`, nil},
		{"SandboxRequest", SandboxRequest{Template: "tp-1", MemMiB: 512, CPUs: 1, Egress: json.RawMessage(`{"allow":[]}`),
			Env: []string{"A=1"}, Secrets: []string{"s"}, Labels: map[string]string{"name": "box"}},
			`{"template":"tp-1","mem_mib":512,"cpus":1,"egress":{"allow":[]},"env":["A=1"],"secrets":["s"],"labels":{"name":"box"}}`, nil},
		{"SnapshotRequest", SnapshotRequest{Name: "s1", Incremental: true, Every: "60s", Keep: 4},
			`{"name":"s1","incremental":true,"every":"60s","keep":4}`, nil},
		{"RollingReply off", RollingReply{}, `{"rolling":null}`, map[string]any{"rolling": nil}},
		{"RollingReply on", RollingReply{Rolling: rolling}, `{"rolling":{"every":"1m0s","keep":8}}`, map[string]any{"rolling": rolling}},
		{"SnapshotList", SnapshotList{Snapshots: []store.Snapshot{}, Rolling: rolling},
			`{"rolling":{"every":"1m0s","keep":8},"snapshots":[]}`, map[string]any{"snapshots": []store.Snapshot{}, "rolling": rolling}},
		{"RollbackRequest", RollbackRequest{Snapshot: "s1"}, `{"snapshot":"s1"}`, map[string]string{"snapshot": "s1"}},
		{"ForkRequest", ForkRequest{N: 2}, `{"n":2}`, map[string]int{"n": 2}},
		{"ForkResult", ForkResult{Parent: "sb-1", PauseMS: 1.5, Children: []store.Sandbox{}},
			`{"children":[],"parent":"sb-1","pause_ms":1.5}`,
			map[string]any{"parent": "sb-1", "pause_ms": 1.5, "children": []store.Sandbox{}}},
		{"ForkResult errors", ForkResult{Parent: "sb-1", Errors: []string{"child 0: x"}},
			`{"children":null,"errors":["child 0: x"],"parent":"sb-1","pause_ms":0}`,
			map[string]any{"parent": "sb-1", "pause_ms": 0.0, "children": []store.Sandbox(nil), "errors": []string{"child 0: x"}}},
		{"ExecRequest", ExecRequest{Argv: []string{"ls"}, Env: []string{"A=1"}, Cwd: "/", TimeoutMS: 5, Stdin: []byte("in")},
			`{"argv":["ls"],"env":["A=1"],"cwd":"/","timeout_ms":5,"stdin":"aW4="}`, nil},
		{"ExecFrame stdout", ExecFrame{Stdout: []byte("hi")}, `{"stdout":"aGk="}`, nil},
		{"ExecFrame exit", ExecFrame{Exit: &code, Signal: "KILL", TimedOut: true}, `{"exit":3,"signal":"KILL","timed_out":true}`, nil},
		{"ExecFrame error", ExecFrame{Error: "gone"}, `{"error":"gone"}`, nil},
		{"FileInfo", FileInfo{Name: "f", Size: 2, Mode: 0o644, ModTime: at, Link: "/x"},
			`{"name":"f","size":2,"mode":420,"mod_time":"2026-01-02T03:04:05Z","is_dir":false,"link":"/x"}`, nil},
		{"Event", Event{Time: at, Type: "created", Sandbox: "sb-1", Template: "tp-1", Detail: "d"},
			`{"time":"2026-01-02T03:04:05Z","type":"created","sandbox":"sb-1","template":"tp-1","detail":"d"}`, nil},
		{"Health", Health{OK: true, Tenant: "alice", Cgroups: 2}, `{"cgroups":2,"ok":true,"tenant":"alice"}`,
			map[string]any{"ok": true, "tenant": "alice", "cgroups": 2}},
		{"Error", Error{Error: "no"}, `{"error":"no"}`, map[string]string{"error": "no"}},
		{"Error in a stream", Error{Error: "no", Status: 404}, `{"error":"no","status":404}`, map[string]any{"error": "no", "status": 404}},
		{"Progress", Progress{Step: "booting", Pct: 10}, `{"progress":"booting","pct":10}`, nil},
		{"Result", Result{Result: map[string]string{"id": "sb-1"}, Status: 201}, `{"result":{"id":"sb-1"},"status":201}`,
			map[string]any{"result": map[string]string{"id": "sb-1"}, "status": 201}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got  %s\nwant %s", b, tc.want)
			}
			if tc.oldMap != nil {
				m, _ := json.Marshal(tc.oldMap)
				if string(b) != string(m) {
					t.Errorf("got %s, the daemon's map wrote %s", b, m)
				}
			}
		})
	}
}

// TestProgressLine decodes each line a long operation's stream has.
func TestProgressLine(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want func(l ProgressLine) bool
	}{
		{Progress{Step: "booting", Pct: 10}, func(l ProgressLine) bool {
			return l.Progress != nil && *l.Progress == "booting" && l.Pct == 10 && l.Result == nil && l.Error == ""
		}},
		{Progress{Step: "", Pct: 0}, func(l ProgressLine) bool { return l.Progress != nil && *l.Progress == "" }},
		{Result{Result: Health{OK: true}, Status: 201}, func(l ProgressLine) bool {
			return l.Progress == nil && l.Status == 201 && string(l.Result) == `{"cgroups":0,"ok":true,"tenant":""}`
		}},
		{Error{Error: "no", Status: 409}, func(l ProgressLine) bool {
			return l.Progress == nil && l.Result == nil && l.Error == "no" && l.Status == 409
		}},
	} {
		b, _ := json.Marshal(tc.v)
		var l ProgressLine
		if err := json.Unmarshal(b, &l); err != nil || !tc.want(l) {
			t.Errorf("%s: decoded %+v, %v", b, l, err)
		}
	}
}

// TestOpenAPI checks that each body's JSON names are its schema's
// properties in hostd/openapi.yaml, no more and no fewer.
func TestOpenAPI(t *testing.T) {
	b, err := os.ReadFile("../openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, tc := range []struct {
		schema string
		v      any
		extra  []string // names documented elsewhere
	}{
		{"TemplateRequest", TemplateRequest{}, nil},
		{"ImageUpload", ImageUpload{}, nil},
		{"Image", store.Image{}, nil},
		{"TemplateImage", store.TemplateImage{}, nil},
		{"SandboxRequest", SandboxRequest{}, nil},
		{"SnapshotRequest", SnapshotRequest{}, nil},
		{"ExecRequest", ExecRequest{}, nil},
		{"ExecFrame", ExecFrame{}, nil},
		{"FileInfo", FileInfo{}, nil},
		{"Event", Event{}, nil},
		{"ProgressLine", ProgressLine{}, nil},
		{"Error", Error{}, []string{"status"}}, // a stream's last line: ProgressLine
	} {
		props, err := schemaProperties(doc, tc.schema)
		if err != nil {
			t.Errorf("%s: %v", tc.schema, err)
			continue
		}
		props = append(props, tc.extra...)
		names := jsonNames(reflect.TypeOf(tc.v))
		slices.Sort(props)
		slices.Sort(names)
		if !slices.Equal(props, names) {
			t.Errorf("%s: openapi.yaml has %v, wire has %v", tc.schema, props, names)
		}
	}
}

// schemaProperties returns the property names of components/schemas/name
// in doc (the layout of hostd/openapi.yaml: two spaces an indent level).
func schemaProperties(doc, name string) ([]string, error) {
	_, rest, ok := strings.Cut(doc, "\n  schemas:")
	if !ok {
		return nil, errors.New("no components/schemas")
	}
	if _, rest, ok = strings.Cut(rest, "\n    "+name+":\n"); !ok {
		return nil, errors.New("no such schema")
	}
	var props []string
	in := false
	for _, line := range strings.Split(rest, "\n") {
		indent := len(line) - len(strings.TrimLeft(line, " "))
		switch {
		case strings.TrimSpace(line) == "":
			continue
		case indent <= 4:
			return props, nil // the next schema
		case indent == 6:
			in = strings.TrimSpace(line) == "properties:"
		case indent == 8 && in:
			k, _, _ := strings.Cut(strings.TrimSpace(line), ":")
			props = append(props, k)
		}
	}
	return props, nil
}

// jsonNames returns the JSON names of struct type t's fields.
func jsonNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		n, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if n == "" {
			n = f.Name
		}
		names = append(names, n)
	}
	return names
}
