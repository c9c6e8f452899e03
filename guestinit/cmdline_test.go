package guestinit

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Param
	}{
		{"empty", "", nil},
		{"only space", " \t\n", nil},
		{"key value and flags", "console=ttyS0 quiet reboot=k\n", []Param{
			{"console", "ttyS0", true}, {"quiet", "", false}, {"reboot", "k", true},
		}},
		{"empty value", "warren.hostname= x", []Param{{"warren.hostname", "", true}, {"x", "", false}}},
		{"value with equals", "root=PARTUUID=ab=cd", []Param{{"root", "PARTUUID=ab=cd", true}}},
		{"quoted value", `a="b c" d`, []Param{{"a", "b c", true}, {"d", "", false}}},
		{"quoted whole param", `"a=b c" d`, []Param{{"a", "b c", true}, {"d", "", false}}},
		{"empty quotes", `a="" b`, []Param{{"a", "", true}, {"b", "", false}}},
		{"unterminated quote", `a="b c`, []Param{{"a", "b c", true}}},
		{"repeated spaces", "  a   b  ", []Param{{"a", "", false}, {"b", "", false}}},
		{"init args after --", "a=1 -- b=2", []Param{{"a", "1", true}, {"--", "", false}, {"b", "2", true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseCmdline(tt.in).Params()
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseCmdline(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
		})
	}
}

func TestCmdlineLookup(t *testing.T) {
	c := ParseCmdline(`warren.hostname=a warren.hostname=b flag empty= warren.poweroff=1`)
	if v, ok := c.Lookup("warren.hostname"); !ok || v != "b" {
		t.Errorf("last value should win: got %q, %v", v, ok)
	}
	if v, ok := c.Lookup("flag"); !ok || v != "" {
		t.Errorf("bare flag: got %q, %v", v, ok)
	}
	if _, ok := c.Lookup("missing"); ok {
		t.Errorf("missing key found")
	}
	if got := c.Get("empty", "def"); got != "def" {
		t.Errorf("Get of empty value = %q, want default", got)
	}
	for key, want := range map[string]bool{"warren.poweroff": true, "flag": true, "missing": false, "warren.hostname": false} {
		if got := c.Bool(key); got != want {
			t.Errorf("Bool(%q) = %v, want %v", key, got, want)
		}
	}
	c = ParseCmdline(`a=0 b=No c=off d=false e=n f=1 g flag2= h=x`)
	for key, want := range map[string]bool{"a": true, "b": true, "c": true, "d": true, "e": true, "f": false, "g": false, "flag2": false, "h": false, "missing": false} {
		if got := c.False(key); got != want {
			t.Errorf("False(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestConfigFromCmdline(t *testing.T) {
	tests := []struct {
		in      string
		want    Config
		wantErr bool
	}{
		{"console=ttyS0", Config{Hostname: "warren", Agent: true}, false},
		{"warren.hostname=vm-7 warren.poweroff=1", Config{Hostname: "vm-7", Poweroff: true, Agent: true}, false},
		{"warren.poweroff=0", Config{Hostname: "warren", Agent: true}, false},
		{"warren.poweroff", Config{Hostname: "warren", Poweroff: true, Agent: true}, false},
		{"warren.shell=1", Config{Hostname: "warren", Shell: true, Agent: true}, false},
		{"warren.hostname=", Config{Hostname: "warren", Agent: true}, false},
		{`warren.hostname="bad name"`, Config{Hostname: "warren", Agent: true}, true},
		{"warren.hostname=-x", Config{Hostname: "warren", Agent: true}, true},
		{"warren.agent=0", Config{Hostname: "warren"}, false},
		{"warren.agent=off", Config{Hostname: "warren"}, false},
		{"warren.agent=FALSE", Config{Hostname: "warren"}, false},
		{"warren.agent=1", Config{Hostname: "warren", Agent: true}, false},
		{"warren.agent", Config{Hostname: "warren", Agent: true}, false},
		{"warren.agent=", Config{Hostname: "warren", Agent: true}, false},
		{"warren.agent=0 warren.agent=1", Config{Hostname: "warren", Agent: true}, false},
	}
	for _, tt := range tests {
		got, err := ConfigFromCmdline(ParseCmdline(tt.in))
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("ConfigFromCmdline(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestValidHostname(t *testing.T) {
	long := strings.Repeat("a", 31) + "." + strings.Repeat("b", 32) // 64 bytes
	for h, ok := range map[string]bool{
		"warren": true, "vm-1": true, "a.b.c": true, "A9": true, long: true,
		strings.Repeat("c", 63): true, strings.Repeat("c", 64): false,
		"": false, long + "b": false, "-a": false, "a-": false, "a-.b": false,
		"a..b": false, ".a": false, "a.": false, "a b": false, "a_b": false, "é": false,
	} {
		if err := ValidHostname(h); (err == nil) != ok {
			t.Errorf("ValidHostname(%q) = %v, want ok=%v", h, err, ok)
		}
	}
}

func FuzzParseCmdline(f *testing.F) {
	for _, s := range []string{"", "a=b c", `a="b c" "d=e f"`, `"`, "x=\"\"\"", "--"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := ParseCmdline(s)
		for _, p := range c.Params() {
			for i := 0; i < len(p.Key); i++ {
				if p.Key[i] == '"' || p.Key[i] == '=' || (isSpace(p.Key[i]) && !strings.Contains(s, `"`)) {
					t.Fatalf("bad key %q from %q", p.Key, s)
				}
			}
		}
		cfg, _ := ConfigFromCmdline(c)
		if ValidHostname(cfg.Hostname) != nil {
			t.Fatalf("config hostname %q is invalid", cfg.Hostname)
		}
	})
}
