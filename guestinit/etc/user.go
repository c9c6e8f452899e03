package etc

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// Credential is who a process runs as: what a user spec resolves to.
type Credential struct {
	// UID and GID are the process's user and primary group.
	UID, GID uint32
	// Groups are the supplementary groups (setgroups(2)), without
	// duplicates; empty when the spec named a group.
	Groups []uint32
	// Name is the user's name from passwd; "" for a numeric uid that
	// passwd does not list.
	Name string
	// Home is the user's home directory from passwd, "/" when passwd
	// does not give one.
	Home string
}

// MaxSpec bounds a user spec.
const MaxSpec = 512

// Resolve resolves a user spec the way container runtimes (runc, Docker)
// resolve an image's User:
//
//   - "" is root ("0");
//   - "name" or "uid": the user's passwd entry gives its uid, primary gid
//     and home, and every group that lists the user's name as a member is
//     a supplementary group. A uid that passwd does not list runs with gid
//     0, home "/" and no supplementary groups; a name it does not list is
//     an error, except "root", which is uid 0 even in an image without a
//     passwd entry for it (the host's "run this as root").
//   - "user:group" (each a name or a number): as above, but the primary
//     group is the one given (a name must be in group) and there are no
//     supplementary groups.
//
// The first entry matching a name or id wins, as for getpwnam(3).
func Resolve(spec string, users []User, groups []Group) (Credential, error) {
	if len(spec) > MaxSpec {
		return Credential{}, fmt.Errorf("user spec of %d bytes, more than %d", len(spec), MaxSpec)
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" {
		if hasGroup {
			return Credential{}, fmt.Errorf("user spec %q: empty user", spec)
		}
		userPart = "0"
	}
	if hasGroup && groupPart == "" {
		return Credential{}, fmt.Errorf("user spec %q: empty group", spec)
	}
	c := Credential{Home: "/"}
	var found *User
	if isNumeric(userPart) {
		uid, err := parseID(userPart)
		if err != nil {
			return Credential{}, fmt.Errorf("user spec %q: %w", spec, err)
		}
		c.UID = uid
		for i := range users {
			if users[i].UID == uid {
				found = &users[i]
				break
			}
		}
	} else {
		for i := range users {
			if users[i].Name == userPart {
				found = &users[i]
				break
			}
		}
		if found == nil && userPart != "root" {
			return Credential{}, fmt.Errorf("user spec %q: no user %q in passwd", spec, userPart)
		}
		if found == nil {
			c.Name = "root"
		}
	}
	if found != nil {
		c.UID, c.GID, c.Name = found.UID, found.GID, found.Name
		if found.Home != "" {
			c.Home = found.Home
		}
	}
	if hasGroup {
		gid, err := resolveGroup(groupPart, groups)
		if err != nil {
			return Credential{}, fmt.Errorf("user spec %q: %w", spec, err)
		}
		c.GID = gid
		return c, nil
	}
	if c.Name != "" {
		seen := map[uint32]bool{}
		for _, g := range groups {
			if seen[g.GID] {
				continue
			}
			for _, m := range g.Members {
				if m == c.Name {
					seen[g.GID] = true
					c.Groups = append(c.Groups, g.GID)
					break
				}
			}
		}
	}
	return c, nil
}

// resolveGroup returns the gid of a group name or number.
func resolveGroup(s string, groups []Group) (uint32, error) {
	if isNumeric(s) {
		return parseID(s)
	}
	for _, g := range groups {
		if g.Name == s {
			return g.GID, nil
		}
	}
	return 0, fmt.Errorf("no group %q in group", s)
}

func isNumeric(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// LookupUser resolves spec (see Resolve) against the passwd and group
// files in dir (an image's /etc). A file that does not exist counts as
// empty; one that cannot be read or parsed is an error.
func LookupUser(dir, spec string) (Credential, error) {
	var users []User
	var groups []Group
	b, err := ReadFile(filepath.Join(dir, "passwd"), MaxFile)
	if err == nil {
		users, err = ParsePasswd(b)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Credential{}, err
	}
	b, err = ReadFile(filepath.Join(dir, "group"), MaxFile)
	if err == nil {
		groups, err = ParseGroup(b)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Credential{}, err
	}
	return Resolve(spec, users, groups)
}
