package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestFindWarren: warren-hostd runs its VMMs from warren-vmm beside it when
// there is one (a smaller process), else warren beside it, else either in
// PATH.
func TestFindWarren(t *testing.T) {
	dir, path := t.TempDir(), t.TempDir()
	inPath := func(names ...string) func(string) (string, error) {
		return func(n string) (string, error) {
			for _, m := range names {
				if m == n {
					return filepath.Join(path, n), nil
				}
			}
			return "", errors.New("not found")
		}
	}
	write := func(p string) {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		beside []string
		path   []string
		want   string
	}{
		{nil, []string{"warren"}, filepath.Join(path, "warren")},
		{nil, []string{"warren", "warren-vmm"}, filepath.Join(path, "warren-vmm")},
		{[]string{"warren"}, []string{"warren-vmm"}, filepath.Join(dir, "warren")},
		{[]string{"warren", "warren-vmm"}, nil, filepath.Join(dir, "warren-vmm")},
		{nil, nil, ""},
	} {
		os.Remove(filepath.Join(dir, "warren"))
		os.Remove(filepath.Join(dir, "warren-vmm"))
		for _, n := range c.beside {
			write(filepath.Join(dir, n))
		}
		got, err := findWarrenIn(dir, inPath(c.path...))
		if got != c.want || (err == nil) != (c.want != "") {
			t.Errorf("beside %v, in PATH %v: %q, %v; want %q", c.beside, c.path, got, err, c.want)
		}
	}
}
