package etc

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

const testPasswd = `root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
# a comment

app:x:1000:1000:App,,,:/home/app:/bin/sh
+nis
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
short:x:1001:1001
dup:x:1002:1002::/first:
dup:x:1003:1003::/second:
`

const testGroup = `root:x:0:
daemon:x:1:
tty:x:5:
sudo:x:27:app
app:x:1000:
docker:x:999:app, dup
dupgid:x:27:app
nogroup:x:65534:
`

func TestParsePasswd(t *testing.T) {
	users, err := ParsePasswd([]byte(testPasswd))
	if err != nil {
		t.Fatal(err)
	}
	want := []User{
		{"root", 0, 0, "/root", "/bin/bash"},
		{"daemon", 1, 1, "/usr/sbin", "/usr/sbin/nologin"},
		{"app", 1000, 1000, "/home/app", "/bin/sh"},
		{"nobody", 65534, 65534, "/nonexistent", "/usr/sbin/nologin"},
		{"short", 1001, 1001, "", ""},
		{"dup", 1002, 1002, "/first", ""},
		{"dup", 1003, 1003, "/second", ""},
	}
	if !reflect.DeepEqual(users, want) {
		t.Errorf("got %+v\nwant %+v", users, want)
	}
}

func TestParseGroup(t *testing.T) {
	groups, err := ParseGroup([]byte(testGroup))
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 8 || groups[5].Name != "docker" || !reflect.DeepEqual(groups[5].Members, []string{"app", "dup"}) || groups[0].Members != nil {
		t.Errorf("got %+v", groups)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		group          bool
	}{
		{"few fields", "root:x:0\n", "line 1: 3 fields", false},
		{"bad uid", "a:x:zero:0::/:\n", "line 1: uid", false},
		{"negative uid", "a:x:-1:0::/:\n", "line 1: uid", false},
		{"uid too large", "a:x:4294967295:0::/:\n", "out of range", false},
		{"uid huge", "a:x:99999999999:0::/:\n", "decimal id", false},
		{"bad gid", "root:x:0:0:root:/root:/bin/sh\nb:x:1:g::/:\n", "line 2: gid", false},
		{"empty name", ":x:0:0::/:\n", "empty name", false},
		{"NUL", "a:x:0:0::/\x00:\n", "NUL", false},
		{"long line", "a:x:0:0:" + strings.Repeat("g", MaxLine) + ":/:\n", "more than", false},
		{"too large", strings.Repeat("#\n", MaxFile/2+1), "more than", false},
		{"group few fields", "g:x\n", "line 1: 2 fields", true},
		{"group bad gid", "g:x:1x:\n", "gid", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.group {
				_, err = ParseGroup([]byte(tc.in))
			} else {
				_, err = ParsePasswd([]byte(tc.in))
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := ParsePasswd([]byte(strings.Repeat("\n", MaxEntries+1))); err == nil {
		t.Error("more than MaxEntries lines accepted")
	}
}

func TestResolve(t *testing.T) {
	users, err := ParsePasswd([]byte(testPasswd))
	if err != nil {
		t.Fatal(err)
	}
	groups, err := ParseGroup([]byte(testGroup))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec string
		want Credential
		err  string
	}{
		{"", Credential{UID: 0, GID: 0, Name: "root", Home: "/root"}, ""},
		{"root", Credential{UID: 0, GID: 0, Name: "root", Home: "/root"}, ""},
		{"0", Credential{UID: 0, GID: 0, Name: "root", Home: "/root"}, ""},
		// Supplementary groups: every group naming the user, once per gid.
		{"app", Credential{UID: 1000, GID: 1000, Groups: []uint32{27, 999}, Name: "app", Home: "/home/app"}, ""},
		{"1000", Credential{UID: 1000, GID: 1000, Groups: []uint32{27, 999}, Name: "app", Home: "/home/app"}, ""},
		// An explicit group: that primary group, no supplementary ones.
		{"app:docker", Credential{UID: 1000, GID: 999, Name: "app", Home: "/home/app"}, ""},
		{"app:5", Credential{UID: 1000, GID: 5, Name: "app", Home: "/home/app"}, ""},
		{"1000:4242", Credential{UID: 1000, GID: 4242, Name: "app", Home: "/home/app"}, ""},
		{"nobody", Credential{UID: 65534, GID: 65534, Name: "nobody", Home: "/nonexistent"}, ""},
		// A uid passwd does not list: gid 0, home /.
		{"4242", Credential{UID: 4242, GID: 0, Home: "/"}, ""},
		{"4242:4243", Credential{UID: 4242, GID: 4243, Home: "/"}, ""},
		{"short", Credential{UID: 1001, GID: 1001, Name: "short", Home: "/"}, ""},
		// The first entry wins.
		{"dup", Credential{UID: 1002, GID: 1002, Groups: []uint32{999}, Name: "dup", Home: "/first"}, ""},
		{"ghost", Credential{}, `no user "ghost"`},
		{"app:ghosts", Credential{}, `no group "ghosts"`},
		{":0", Credential{}, "empty user"},
		{"app:", Credential{}, "empty group"},
		{"4294967295", Credential{}, "out of range"},
		{strings.Repeat("a", MaxSpec+1), Credential{}, "more than"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := Resolve(tc.spec, users, groups)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	// An image without passwd: numbers and root only.
	if c, err := Resolve("root", nil, nil); err != nil || c.UID != 0 || c.Name != "root" || c.Home != "/" {
		t.Errorf("root without passwd: %+v, %v", c, err)
	}
	if _, err := Resolve("app", nil, nil); err == nil {
		t.Error("a name without passwd resolved")
	}
}

func TestEditHosts(t *testing.T) {
	debian := "127.0.0.1\tlocalhost\n127.0.1.1\tdebian.example debian\n\n# The following lines are desirable for IPv6 capable hosts\n::1     localhost ip6-localhost ip6-loopback\nff02::1 ip6-allnodes\n"
	for _, tc := range []struct {
		name, old, host, want string
	}{
		{"none", "", "box", "127.0.0.1\tlocalhost\n127.0.1.1\tbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{"debian", debian, "fork-1",
			"127.0.0.1\tlocalhost\n127.0.1.1\tfork-1\n\n# The following lines are desirable for IPv6 capable hosts\n::1     localhost ip6-localhost ip6-loopback\nff02::1 ip6-allnodes\n"},
		{"fqdn", "127.0.0.1 localhost\n::1 localhost\n", "a.b.c", "127.0.0.1 localhost\n127.0.1.1\ta.b.c a\n::1 localhost\n"},
		{"docker", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n172.17.0.2\tabc123\n", "box",
			"127.0.0.1\tlocalhost\n127.0.1.1\tbox\n::1\tlocalhost ip6-localhost ip6-loopback\n172.17.0.2\tabc123\n"},
		{"several own lines", "10.0.0.1 db\n127.0.1.1 old\n127.0.0.1 localhost\n127.0.1.1 older # c\n", "new",
			"10.0.0.1 db\n127.0.1.1\tnew\n127.0.0.1 localhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{"no newline, comment only", "# hosts", "h", "127.0.0.1\tlocalhost\n127.0.1.1\th\n::1\tlocalhost ip6-localhost ip6-loopback\n# hosts\n"},
		{"commented localhost is not one", "#127.0.0.1 localhost\n::1 x\n", "h", "127.0.0.1\tlocalhost\n127.0.1.1\th\n#127.0.0.1 localhost\n::1 x\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EditHosts([]byte(tc.old), tc.host)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
			again, err := EditHosts(got, tc.host)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("not idempotent: %q, %v", again, err)
			}
		})
	}
	for _, bad := range []string{"", "a b", "a#b", "a\nb", strings.Repeat("a", 254)} {
		if _, err := EditHosts(nil, bad); err == nil {
			t.Errorf("hostname %q accepted", bad)
		}
	}
	if _, err := EditHosts([]byte(strings.Repeat("x", MaxLine+1)), "h"); err == nil {
		t.Error("a line over MaxLine accepted")
	}
}
