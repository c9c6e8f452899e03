package guestinit

import (
	"fmt"
)

// maxHostname is the kernel's limit (__NEW_UTS_LEN).
const maxHostname = 64

// Config is what PID 1 takes from the kernel command line.
type Config struct {
	Hostname string
	Poweroff bool
	Shell    bool
	// Agent says to serve the guest agent on vsock (when the VM has a
	// vsock device): true unless warren.agent is set to a false value.
	Agent bool
}

// ConfigFromCmdline reads the warren.* keys. An invalid hostname is
// reported and replaced by DefaultHostname, so a bad command line never
// stops the boot.
func ConfigFromCmdline(c Cmdline) (Config, error) {
	cfg := Config{
		Hostname: c.Get(KeyHostname, DefaultHostname),
		Poweroff: c.Bool(KeyPoweroff),
		Shell:    c.Bool(KeyShell),
		Agent:    !c.False(KeyAgent),
	}
	err := validOr(&cfg.Hostname, KeyHostname, DefaultHostname, ValidHostname)
	return cfg, err
}

// ValidHostname accepts RFC 1123 host names: dot-separated labels of
// letters, digits and hyphens, 1–63 bytes each, not starting or ending with
// a hyphen, at most 64 bytes in all.
func ValidHostname(h string) error {
	if h == "" {
		return fmt.Errorf("empty hostname")
	}
	if len(h) > maxHostname {
		return fmt.Errorf("hostname longer than %d bytes", maxHostname)
	}
	label := 0
	for i := 0; i < len(h); i++ {
		ch := h[i]
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9':
			label++
		case ch == '-':
			if label == 0 || i+1 == len(h) || h[i+1] == '.' {
				return fmt.Errorf("hyphen at the edge of a label")
			}
			label++
		case ch == '.':
			if label == 0 || i+1 == len(h) {
				return fmt.Errorf("empty label")
			}
			label = 0
		default:
			return fmt.Errorf("invalid byte %q", ch)
		}
		if label > 63 {
			return fmt.Errorf("label longer than 63 bytes")
		}
	}
	return nil
}
