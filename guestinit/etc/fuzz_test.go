package etc

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParsePasswd checks that a passwd file never panics the parser or
// the resolver, and that what it accepts is within the bounds.
func FuzzParsePasswd(f *testing.F) {
	f.Add([]byte(testPasswd), "app")
	f.Add([]byte("root:x:0:0::/root:/bin/sh\n"), "0:0")
	f.Add([]byte("a:x:1:1\r\n+b\n-c\n# d\n"), "1")
	f.Fuzz(func(t *testing.T, b []byte, spec string) {
		users, err := ParsePasswd(b)
		if err != nil {
			return
		}
		if len(users) > MaxEntries {
			t.Fatalf("%d users", len(users))
		}
		for _, u := range users {
			if u.Name == "" || strings.ContainsAny(u.Name, ":\n\x00") || u.UID > maxID || u.GID > maxID {
				t.Fatalf("bad entry %+v", u)
			}
		}
		c, err := Resolve(spec, users, nil)
		if err == nil && c.Home == "" {
			t.Fatalf("empty home for %q", spec)
		}
	})
}

// FuzzParseGroup is FuzzParsePasswd for group files.
func FuzzParseGroup(f *testing.F) {
	f.Add([]byte(testGroup), "app")
	f.Add([]byte("g:x:5:a,b,,c\n"), "a:g")
	f.Fuzz(func(t *testing.T, b []byte, spec string) {
		groups, err := ParseGroup(b)
		if err != nil {
			return
		}
		for _, g := range groups {
			if g.Name == "" || g.GID > maxID {
				t.Fatalf("bad entry %+v", g)
			}
			for _, m := range g.Members {
				if m == "" || strings.ContainsAny(m, ",:\n") {
					t.Fatalf("bad member %q", m)
				}
			}
		}
		users := []User{{Name: "a", UID: 1, GID: 1, Home: "/a"}}
		c, err := Resolve(spec, users, groups)
		if err != nil {
			return
		}
		seen := map[uint32]bool{}
		for _, g := range c.Groups {
			if seen[g] {
				t.Fatalf("duplicate supplementary group %d", g)
			}
			seen[g] = true
		}
	})
}

// FuzzEditHosts checks EditHosts on any file: no panic, one line for
// HostnameAddr, every other line kept in order, and idempotence.
func FuzzEditHosts(f *testing.F) {
	f.Add([]byte("127.0.0.1\tlocalhost\n127.0.1.1\tdebian\n::1 localhost\n"), "box")
	f.Add([]byte(""), "a.b")
	f.Add([]byte("# x\n\n127.0.1.1 a # c\r\n10.0.0.1 db"), "h")
	f.Fuzz(func(t *testing.T, old []byte, host string) {
		out, err := EditHosts(old, host)
		if err != nil {
			return
		}
		own := 0
		var kept []string
		for _, l := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n") {
			if addr, _ := hostsFields(l); addr == HostnameAddr {
				own++
				if !strings.HasPrefix(l, HostnameAddr+"\t"+host) {
					t.Fatalf("own line %q for %q", l, host)
				}
				continue
			}
			kept = append(kept, l)
		}
		if own != 1 {
			t.Fatalf("%d lines for %s in %q", own, HostnameAddr, out)
		}
		// Every input line that is not for HostnameAddr is still there,
		// in order (the added loopback lines may come between them).
		i := 0
		if len(old) > 0 {
			for _, l := range strings.Split(strings.TrimSuffix(string(old), "\n"), "\n") {
				if addr, _ := hostsFields(l); addr == HostnameAddr {
					continue
				}
				for i < len(kept) && kept[i] != l {
					i++
				}
				if i == len(kept) {
					t.Fatalf("line %q lost from %q: %q", l, old, out)
				}
				i++
			}
		}
		again, err := EditHosts(out, host)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent on %q: %q, %v", out, again, err)
		}
	})
}
