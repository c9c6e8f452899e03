package vmmctl

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Jail is how a VMM process confines itself once its VM is set up: the
// `--jail` value of `warren run` and `warren restore` (Run.Jail,
// Restore.Jail hold it encoded). Encode writes it and ParseJail reads it;
// vmmproc.ParseJail turns it into the jail the process enters. The zero
// value is no jail.
//
// The encoding is the profile, then the mode, then the confinement
// options, comma-separated (so no path may hold ',' or ':'):
//
//	strict|vmm[,errno|,log|,kill]
//	root=DIR             pivot_root into a jail on DIR
//	user=UID:GID         then leave root for this uid and gid
//	groups=G1:G2...      with these supplementary groups (after user=)
//	bind=PATH[:rw][:exec] a path visible in the jail, at the same path
//	dev=kvm|tun|null     a device node made in the jail, owned by the user
type Jail struct {
	// Profile is "strict" (a VMM that never starts a process) or "vmm"
	// (one whose control API may fork); "" is no jail.
	Profile string
	// Mode is what a syscall outside the profile gets: "" or "errno"
	// (EPERM), "log" (allowed and logged) or "kill".
	Mode string
	// Root is the directory the VMM makes its jail on and pivot_roots
	// into ("": it stays in its root); Binds are the host paths visible
	// there and Devices the device nodes made there ("kvm", "tun",
	// "null"). Binds and Devices need Root.
	Root    string
	Binds   []Bind
	Devices []string
	// UID and GID, when not 0, are the ids the VMM leaves root for, with
	// the supplementary Groups (at most MaxJailGroups, none 0).
	UID, GID int
	Groups   []int
}

// Bind is a host path visible in a jail at the same path.
type Bind struct {
	// Path is absolute and clean, not "/".
	Path string
	// Writable binds it read-write (else read-only); Exec lets programs
	// under it run (else noexec).
	Writable, Exec bool
}

// MaxJailGroups is how many supplementary groups a Jail may carry.
const MaxJailGroups = 64

// jailDevices are the device nodes a jail may have.
var jailDevices = []string{"kvm", "tun", "null"}

// On reports whether j confines at all.
func (j Jail) On() bool { return j.Profile != "" }

// Encode checks j and writes it as the --jail value ("" for no jail).
func (j Jail) Encode() (string, error) {
	if err := j.check(); err != nil {
		return "", err
	}
	if !j.On() {
		return "", nil
	}
	opts := []string{j.Profile}
	if j.Mode != "" && j.Mode != "errno" {
		opts = append(opts, j.Mode)
	}
	if j.Root != "" {
		opts = append(opts, "root="+j.Root)
	}
	for _, d := range j.Devices {
		opts = append(opts, "dev="+d)
	}
	if j.UID != 0 {
		opts = append(opts, fmt.Sprintf("user=%d:%d", j.UID, j.GID))
	}
	if len(j.Groups) > 0 {
		gs := make([]string, len(j.Groups))
		for i, g := range j.Groups {
			gs[i] = strconv.Itoa(g)
		}
		opts = append(opts, "groups="+strings.Join(gs, ":"))
	}
	for _, b := range j.Binds {
		o := "bind=" + b.Path
		if b.Writable {
			o += ":rw"
		}
		if b.Exec {
			o += ":exec"
		}
		opts = append(opts, o)
	}
	return strings.Join(opts, ","), nil
}

// check reports what makes j unencodable or meaningless.
func (j Jail) check() error {
	switch j.Profile {
	case "", "strict", "vmm":
	default:
		return fmt.Errorf("jail: profile %q: want strict or vmm", j.Profile)
	}
	switch j.Mode {
	case "", "errno", "log", "kill":
	default:
		return fmt.Errorf("jail: mode %q: want errno, log or kill", j.Mode)
	}
	if !j.On() && (j.Mode != "" || j.Root != "" || len(j.Binds) > 0 || len(j.Devices) > 0 || j.UID != 0 || len(j.Groups) > 0) {
		return errors.New("jail: options without a profile")
	}
	if j.Root != "" && (!filepath.IsAbs(j.Root) || strings.ContainsAny(j.Root, ",:")) {
		return fmt.Errorf("jail: root %q: want one absolute path without ',' or ':'", j.Root)
	}
	if j.Root == "" && (len(j.Binds) > 0 || len(j.Devices) > 0) {
		return errors.New("jail: binds and devices need a root")
	}
	for _, b := range j.Binds {
		if !filepath.IsAbs(b.Path) || filepath.Clean(b.Path) != b.Path || b.Path == "/" || strings.ContainsAny(b.Path, ",:") {
			return fmt.Errorf("jail: bind %q: want a clean absolute path without ',' or ':'", b.Path)
		}
	}
	for _, d := range j.Devices {
		if !slices.Contains(jailDevices, d) {
			return fmt.Errorf("jail: device %q: want kvm, tun or null", d)
		}
	}
	if (j.UID != 0 || j.GID != 0) && (j.UID <= 0 || j.GID <= 0) {
		return fmt.Errorf("jail: user %d:%d: want one UID:GID, not root", j.UID, j.GID)
	}
	if len(j.Groups) > 0 && j.UID == 0 {
		return errors.New("jail: groups want a user")
	}
	if len(j.Groups) > MaxJailGroups {
		return fmt.Errorf("jail: %d groups, at most %d", len(j.Groups), MaxJailGroups)
	}
	for _, g := range j.Groups {
		if g <= 0 {
			return fmt.Errorf("jail: group %d: none may be root's", g)
		}
	}
	return nil
}

// ParseJail reads a --jail value: "", "off" or "none" (no jail), or
// Encode's form, in which the mode may stand only right after the
// profile, and root= and user= once each. The value is checked as Encode
// checks it.
func ParseJail(v string) (Jail, error) {
	var j Jail
	items := strings.Split(strings.TrimSpace(v), ",")
	switch items[0] {
	case "", "off", "none":
		if len(items) > 1 {
			return j, fmt.Errorf("--jail %q: a mode or options without a profile", v)
		}
		return j, nil
	case "strict", "vmm":
		j.Profile = items[0]
	default:
		return j, fmt.Errorf("--jail %q: want strict or vmm (optionally ,log or ,kill)", v)
	}
	items = items[1:]
	if len(items) > 0 && !strings.Contains(items[0], "=") {
		j.Mode, items = items[0], items[1:]
		if j.Mode != "errno" && j.Mode != "log" && j.Mode != "kill" {
			return j, fmt.Errorf("--jail %q: mode %q: want errno, log or kill", v, j.Mode)
		}
	}
	user := false
	for _, o := range items {
		k, val, ok := strings.Cut(o, "=")
		if !ok {
			return j, fmt.Errorf("--jail %q: unexpected %q", v, o)
		}
		switch k {
		case "root":
			if j.Root != "" || val == "" {
				return j, fmt.Errorf("--jail %q: root=%q: want one absolute path", v, val)
			}
			j.Root = val
		case "user":
			us, gs, ok := strings.Cut(val, ":")
			uid, err1 := strconv.Atoi(us)
			gid, err2 := strconv.Atoi(gs)
			if !ok || err1 != nil || err2 != nil || uid <= 0 || gid <= 0 || user {
				return j, fmt.Errorf("--jail %q: user=%q: want one UID:GID, not root", v, val)
			}
			j.UID, j.GID, user = uid, gid, true
		case "groups":
			if !user || j.Groups != nil {
				return j, fmt.Errorf("--jail %q: groups= wants one user= before it", v)
			}
			for _, g := range strings.Split(val, ":") {
				gid, err := strconv.Atoi(g)
				if err != nil || gid <= 0 || len(j.Groups) >= MaxJailGroups {
					return j, fmt.Errorf("--jail %q: groups=%q: want up to %d GIDs, none root's, ':'-separated", v, val, MaxJailGroups)
				}
				j.Groups = append(j.Groups, gid)
			}
		case "bind":
			f := strings.Split(val, ":")
			b := Bind{Path: f[0]}
			for _, m := range f[1:] {
				switch m {
				case "rw":
					b.Writable = true
				case "exec":
					b.Exec = true
				default:
					return j, fmt.Errorf("--jail %q: bind=%q: unknown flag %q", v, val, m)
				}
			}
			j.Binds = append(j.Binds, b)
		case "dev":
			j.Devices = append(j.Devices, val)
		default:
			return j, fmt.Errorf("--jail %q: unknown option %q", v, k)
		}
	}
	if err := j.check(); err != nil {
		return j, fmt.Errorf("--jail %q: %w", v, err)
	}
	return j, nil
}
