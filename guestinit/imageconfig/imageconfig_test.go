package imageconfig

import (
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	c := Config{Ref: "debian:12", Digest: "sha256:ab", Env: []string{"PATH=/usr/bin", "A="}, WorkingDir: "/srv",
		User: "1000:1000", Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"echo hi"}}
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != Version || got.User != c.User || got.WorkingDir != c.WorkingDir || len(got.Env) != 2 {
		t.Fatalf("round trip: %+v", got)
	}
	if a := got.Argv(); len(a) != 3 || a[2] != "echo hi" {
		t.Fatalf("Argv = %q", a)
	}
	if (Config{}).Argv() != nil {
		t.Fatal("Argv of an empty config is not nil")
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not json", `{`, "imageconfig"},
		{"unknown field", `{"version":1,"x":1}`, "unknown field"},
		{"version", `{"version":2}`, "version 2"},
		{"no version", `{}`, "version 0"},
		{"bad env", `{"version":1,"env":["NOEQUALS"]}`, "not KEY=VALUE"},
		{"empty key", `{"version":1,"env":["=v"]}`, "not KEY=VALUE"},
		{"relative cwd", `{"version":1,"working_dir":"srv"}`, "clean absolute"},
		{"unclean cwd", `{"version":1,"working_dir":"/srv/../etc/"}`, "clean absolute"},
		{"nul", `{"version":1,"user":"a\u0000b"}`, "NUL"},
		{"trailing", `{"version":1} {}`, "trailing"},
		{"too big", `{"version":1,"ref":"` + strings.Repeat("a", MaxBytes) + `"}`, "more than"},
		{"long string", `{"version":1,"ref":"` + strings.Repeat("a", MaxString+1) + `"}`, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse(%.40q) = %v, want an error with %q", tc.in, err, tc.want)
			}
		})
	}
	many := make([]string, MaxEntries+1)
	for i := range many {
		many[i] = "x"
	}
	if _, err := (Config{Cmd: many}).Marshal(); err == nil {
		t.Fatal("Marshal accepted too many cmd entries")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"version":1,"env":["A=1"],"working_dir":"/w","user":"u","cmd":["c"]}`))
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			return
		}
		out, err := c.Marshal()
		if err != nil {
			t.Fatalf("a parsed config does not marshal: %v", err)
		}
		if _, err := Parse(out); err != nil {
			t.Fatalf("a marshalled config does not parse: %v", err)
		}
	})
}
