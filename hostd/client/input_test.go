package client_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/client"
)

func TestReadPolicy(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.json"), filepath.Join(dir, "bad.json")
	os.WriteFile(good, []byte(`{"allow":[]}`), 0o600)
	os.WriteFile(bad, []byte(`{"allow":`), 0o600)
	if b, err := client.ReadPolicy(good); err != nil || string(b) != `{"allow":[]}` {
		t.Errorf("a JSON policy: %q %v", b, err)
	}
	if _, err := client.ReadPolicy(bad); err == nil || err.Error() != bad+": not JSON" {
		t.Errorf("not JSON: %v", err)
	}
	if _, err := client.ReadPolicy(filepath.Join(dir, "none")); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}

func TestParseLabels(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want map[string]string
		err  string
	}{
		{in: nil},
		{in: []string{"a=1", "b=", "c=x=y", "a=2"}, want: map[string]string{"a": "2", "b": "", "c": "x=y"}},
		{in: []string{"a=1", "novalue"}, err: `"novalue" is not KEY=VALUE`},
		{in: []string{"=v"}, err: `"=v" is not KEY=VALUE`},
	} {
		got, err := client.ParseLabels(tc.in)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("ParseLabels(%q): %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseLabels(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestReadSecret(t *testing.T) {
	file := filepath.Join(t.TempDir(), "s")
	os.WriteFile(file, []byte("from file\r\n"), 0o600)
	for _, tc := range []struct {
		src, stdin, want string
	}{
		{file, "ignored", "from file"},
		{"-", "typed\n", "typed"},
		{"", "two\n\n", "two\n"},
		{"-", "no newline", "no newline"},
		{"-", strings.Repeat("x", client.MaxSecretRead+5), strings.Repeat("x", client.MaxSecretRead)},
	} {
		v, err := client.ReadSecret(tc.src, strings.NewReader(tc.stdin))
		if err != nil || string(v) != tc.want {
			t.Errorf("ReadSecret(%q, %.20q): %.20q %v, want %.20q", tc.src, tc.stdin, v, err, tc.want)
		}
	}
	if v, err := client.ReadSecret("", nil); err != nil || len(v) != 0 {
		t.Errorf("no stdin: %q %v", v, err)
	}
	if _, err := client.ReadSecret(file+".none", nil); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}
