package etc

import (
	"bytes"
	"fmt"
	"strings"
)

// Where the hosts and hostname files are in a root file system.
const (
	HostsPath    = "/etc/hosts"
	HostnamePath = "/etc/hostname"
)

// HostnameAddr is the address Debian maps the machine's own name to in
// /etc/hosts (a machine without a permanent address): EditHosts owns every
// line for it.
const HostnameAddr = "127.0.1.1"

// The loopback lines EditHosts adds when the file has none.
const (
	hostsLocalhost4 = "127.0.0.1\tlocalhost"
	hostsLocalhost6 = "::1\tlocalhost ip6-localhost ip6-loopback"
)

// EditHosts returns the hosts(5) file old (nil for none) edited for
// hostname, keeping every other line as it is:
//
//   - every line for HostnameAddr is replaced by one line
//     "127.0.1.1<TAB>hostname" (plus its first label as an alias when it
//     has dots), where the first of them was, or else right after the
//     127.0.0.1 localhost line, or else at the end;
//   - "127.0.0.1<TAB>localhost" is added at the top when no line maps
//     localhost to 127.0.0.1, and "::1<TAB>localhost ip6-localhost
//     ip6-loopback" after it when no line is for ::1.
//
// Editing its own output again with the same hostname changes nothing.
// old is bounded by MaxFile, MaxLine and MaxEntries; hostname must be one
// hosts(5) name (1 to 253 bytes, no white space, '#' or control bytes).
func EditHosts(old []byte, hostname string) ([]byte, error) {
	if err := checkHostsName(hostname); err != nil {
		return nil, err
	}
	if len(old) > MaxFile {
		return nil, fmt.Errorf("hosts: %d bytes, more than %d", len(old), MaxFile)
	}
	var lines []string
	if len(old) > 0 {
		lines = strings.Split(strings.TrimSuffix(string(old), "\n"), "\n")
	}
	if len(lines) > MaxEntries {
		return nil, fmt.Errorf("hosts: more than %d lines", MaxEntries)
	}
	own := HostnameAddr + "\t" + hostname
	if short, _, ok := strings.Cut(hostname, "."); ok && short != "" {
		own += " " + short
	}
	out := make([]string, 0, len(lines)+3)
	placed, has4, has6 := false, false, false
	after4 := -1 // index in out of the 127.0.0.1 localhost line
	for i, l := range lines {
		if len(l) > MaxLine {
			return nil, fmt.Errorf("hosts line %d: %d bytes, more than %d", i+1, len(l), MaxLine)
		}
		addr, names := hostsFields(l)
		switch addr {
		case HostnameAddr:
			if !placed {
				out = append(out, own)
				placed = true
			}
			continue
		case "127.0.0.1":
			for _, n := range names {
				if n == "localhost" {
					has4 = true
					if after4 < 0 {
						after4 = len(out)
					}
				}
			}
		case "::1":
			has6 = true
		}
		out = append(out, l)
	}
	if !has4 {
		out = append([]string{hostsLocalhost4}, out...)
		after4 = 0
	}
	if !has6 {
		out = insertAt(out, after4+1, hostsLocalhost6)
	}
	if !placed {
		out = insertAt(out, after4+1, own)
	}
	var b bytes.Buffer
	for _, l := range out {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

// hostsFields returns the address and names of a hosts line, without its
// comment; "" for a blank or comment line.
func hostsFields(l string) (addr string, names []string) {
	if i := strings.IndexByte(l, '#'); i >= 0 {
		l = l[:i]
	}
	f := strings.Fields(l)
	if len(f) == 0 {
		return "", nil
	}
	return f[0], f[1:]
}

func insertAt(s []string, i int, v string) []string {
	if i > len(s) {
		i = len(s)
	}
	s = append(s, "")
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}

// checkHostsName accepts a name that is one field of a hosts line.
func checkHostsName(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("hosts: hostname of %d bytes, want 1 to 253", len(h))
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; c <= ' ' || c == '#' || c == 0x7f {
			return fmt.Errorf("hosts: hostname %q has a space, '#' or control byte", h)
		}
	}
	return nil
}

// HostnameFile is the content of /etc/hostname for hostname.
func HostnameFile(hostname string) []byte { return []byte(hostname + "\n") }
