package client_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

func TestParseCopyTarget(t *testing.T) {
	for in, want := range map[string]client.CopyTarget{
		"box:/tmp/f":     {Sandbox: "box", Path: "/tmp/f"},
		"box:/a:/b":      {Sandbox: "box", Path: "/a:/b"},
		"./local":        {Path: "./local"},
		":/etc/hosts":    {Path: ":/etc/hosts"},
		"-":              {Path: "-"},
		"c:relative/dir": {Path: "c:relative/dir"},
	} {
		if got := client.ParseCopyTarget(in); got != want {
			t.Errorf("ParseCopyTarget(%q) = %+v, want %+v", in, got, want)
		}
	}
}

func TestCopy(t *testing.T) {
	_, c := stubClient(t, "")
	ctx := context.Background()
	tpl, err := c.CreateTemplate(ctx, wire.TemplateRequest{Kernel: "vmlinux"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, wire.SandboxRequest{Template: tpl.ID, Labels: map[string]string{"name": "box"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	host := filepath.Join(dir, "f")
	if err := os.WriteFile(host, []byte("data"), 0o640); err != nil {
		t.Fatal(err)
	}
	// In by name, into a directory (the base name kept); out by id to a
	// file (the mode kept) and to stdout; stdin in.
	if err := c.Copy(ctx, host, "box:/tmp/", nil, nil); err != nil {
		t.Fatal(err)
	}
	back := filepath.Join(dir, "back")
	if err := c.Copy(ctx, sb.ID+":/tmp/f", back, nil, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(back); err != nil || string(b) != "data" {
		t.Errorf("copied back: %q %v", b, err)
	}
	if fi, err := os.Stat(back); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("copied back: mode %v %v", fi.Mode(), err)
	}
	if err := c.Copy(ctx, "-", "box:/tmp/in", strings.NewReader("typed"), nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Copy(ctx, "-", "box:/tmp/empty", nil, nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := c.Copy(ctx, "box:/tmp/in", "-", nil, &out); err != nil || out.String() != "typed" {
		t.Errorf("copied to stdout: %q %v", out.String(), err)
	}
	for _, tc := range []struct{ src, dst, want string }{
		{"a", "b", "exactly one of a and b must be SANDBOX:/guest/path"},
		{"box:/a", "box:/b", "exactly one of"},
		{host, "nobox:/tmp/x", "not found"},
		{"box:/nope", back, "404"},
		{dir, "box:/tmp/x", "is a directory"},
	} {
		if err := c.Copy(ctx, tc.src, tc.dst, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Copy(%q, %q): %v, want %q", tc.src, tc.dst, err, tc.want)
		}
	}
	if b, _ := os.ReadFile(back); string(b) != "data" {
		t.Errorf("a failed copy changed the host file: %q", b)
	}
}
