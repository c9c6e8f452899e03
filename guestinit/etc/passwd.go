// Package etc reads and edits the guest's system files under /etc: the
// user and group databases (passwd, group) that the agent resolves users
// against, the hosts and hostname files that PID 1 and the agent keep in
// step with the hostname, and the bounded reads and atomic writes that all
// of them go through.
//
// Everything here reads files of an image root file system, which the
// image (and, later, any process in the guest running as root) controls:
// the parsers bound what they accept (MaxFile, MaxLine, MaxEntries), never
// panic and are fuzzed; ReadFile refuses anything but a regular file of
// bounded size, so a FIFO or /dev/zero put in a file's place cannot hang
// or exhaust the reader.
package etc

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// Bounds on the files this package parses.
const (
	// MaxFile bounds the size of passwd, group and hosts files.
	MaxFile = 4 << 20
	// MaxLine bounds one line.
	MaxLine = 64 << 10
	// MaxEntries bounds the lines of one file.
	MaxEntries = 1 << 16
)

// User is one entry of a passwd(5) file.
type User struct {
	Name  string
	UID   uint32
	GID   uint32
	Home  string
	Shell string
}

// Group is one entry of a group(5) file.
type Group struct {
	Name    string
	GID     uint32
	Members []string
}

// ParsePasswd reads a passwd(5) file: name:password:uid:gid:gecos:home:shell
// lines. Blank lines, comments (#) and NIS compat lines (+, -) are skipped;
// missing trailing fields are empty. A line with an empty name or a uid or
// gid that is not a decimal id is an error naming the line, as is input
// over the bounds.
func ParsePasswd(b []byte) ([]User, error) {
	return parseEntries("passwd", b, 4, func(f []string) (User, error) {
		u := User{Name: f[0]}
		var err error
		if u.UID, err = parseID(f[2]); err != nil {
			return u, fmt.Errorf("uid: %w", err)
		}
		if u.GID, err = parseID(f[3]); err != nil {
			return u, fmt.Errorf("gid: %w", err)
		}
		if len(f) > 5 {
			u.Home = f[5]
		}
		if len(f) > 6 {
			u.Shell = f[6]
		}
		return u, nil
	})
}

// ParseGroup reads a group(5) file: name:password:gid:member,member lines,
// with the same rules as ParsePasswd.
func ParseGroup(b []byte) ([]Group, error) {
	return parseEntries("group", b, 3, func(f []string) (Group, error) {
		g := Group{Name: f[0]}
		var err error
		if g.GID, err = parseID(f[2]); err != nil {
			return g, fmt.Errorf("gid: %w", err)
		}
		if len(f) > 3 && f[3] != "" {
			for _, m := range strings.Split(f[3], ",") {
				if m = strings.TrimSpace(m); m != "" {
					g.Members = append(g.Members, m)
				}
			}
		}
		return g, nil
	})
}

// parseEntries reads the entry lines of a file called name (eachLine),
// each of at least minFields fields, into what entry makes of them; an
// error names the line.
func parseEntries[T any](name string, b []byte, minFields int, entry func(fields []string) (T, error)) ([]T, error) {
	var out []T
	err := eachLine(name, b, func(n int, f []string) error {
		if len(f) < minFields {
			return fmt.Errorf("%s line %d: %d fields, want at least %d", name, n, len(f), minFields)
		}
		e, err := entry(f)
		if err != nil {
			return fmt.Errorf("%s line %d: %w", name, n, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// eachLine calls fn with the colon-separated fields of each entry line of
// a file called name (for errors), numbered from 1, within the bounds.
func eachLine(name string, b []byte, fn func(n int, fields []string) error) error {
	if len(b) > MaxFile {
		return fmt.Errorf("%s: %d bytes, more than %d", name, len(b), MaxFile)
	}
	n := 0
	for len(b) > 0 {
		n++
		if n > MaxEntries {
			return fmt.Errorf("%s: more than %d lines", name, MaxEntries)
		}
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) > MaxLine {
			return fmt.Errorf("%s line %d: %d bytes, more than %d", name, n, len(line), MaxLine)
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if bytes.IndexByte(line, 0) >= 0 {
			return fmt.Errorf("%s line %d: NUL byte", name, n)
		}
		s := strings.TrimSpace(string(line))
		if s == "" || s[0] == '#' || s[0] == '+' || s[0] == '-' {
			continue
		}
		f := strings.Split(s, ":")
		if f[0] == "" {
			return fmt.Errorf("%s line %d: empty name", name, n)
		}
		if err := fn(n, f); err != nil {
			return err
		}
	}
	return nil
}

// maxID is the largest valid uid or gid: (uid_t)-1 means "no change" to
// setuid(2) and friends.
const maxID = 1<<32 - 2

// parseID reads a decimal uid or gid.
func parseID(s string) (uint32, error) {
	if s == "" || len(s) > 10 {
		return 0, fmt.Errorf("%q is not a decimal id", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a decimal id", s)
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > maxID {
		return 0, fmt.Errorf("id %q out of range", s)
	}
	return uint32(v), nil
}
