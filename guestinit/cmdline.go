package guestinit

import (
	"fmt"
	"slices"
	"strings"
)

// Command-line keys read by PID 1.
const (
	// KeyHostname sets the guest hostname (default DefaultHostname).
	KeyHostname = "warren.hostname"
	// KeyPoweroff, when "1", powers the VM off right after the ready line.
	KeyPoweroff = "warren.poweroff"
	// KeyShell, when "1", starts /bin/sh on the console after the ready
	// line (debugging only; ignored with warren.poweroff=1).
	KeyShell = "warren.shell"
	// KeyAgent, when "0" (or another false value), keeps PID 1 from
	// starting the guest agent on vsock. The agent runs by default.
	KeyAgent = "warren.agent"
)

// DefaultHostname is used when the command line has no warren.hostname.
const DefaultHostname = "warren"

// Cmdline is a parsed kernel command line. Parameters keep their order;
// when a key repeats, the last value wins (as for most kernel parameters).
type Cmdline struct {
	params []Param
}

// Param is one command-line parameter. A bare flag ("quiet") has
// HasValue false and an empty Value; "key=" has HasValue true.
type Param struct {
	Key      string
	Value    string
	HasValue bool
}

// ParseCmdline splits a kernel command line (the contents of /proc/cmdline)
// the way the kernel's next_arg does: parameters are separated by
// whitespace, double quotes group whitespace into one parameter and are
// removed (`key="a b"` and `"key=a b"` both give key → "a b"), and the first
// '=' separates key from value. There are no escapes. Input is treated as
// untrusted; parsing never fails.
func ParseCmdline(s string) Cmdline {
	var (
		c       Cmdline
		tok     strings.Builder
		inTok   bool
		inQuote bool
	)
	flush := func() {
		if inTok {
			c.params = append(c.params, splitParam(tok.String()))
		}
		tok.Reset()
		inTok = false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '"':
			inQuote = !inQuote
			inTok = true
		case !inQuote && isSpace(ch):
			flush()
		default:
			tok.WriteByte(ch)
			inTok = true
		}
	}
	flush()
	return c
}

func splitParam(p string) Param {
	k, v, ok := strings.Cut(p, "=")
	return Param{Key: k, Value: v, HasValue: ok}
}

// isSpace matches the kernel's isspace for the bytes that can appear in a
// command line (and the trailing newline of /proc/cmdline).
func isSpace(ch byte) bool {
	switch ch {
	case ' ', '\t', '\n', '\v', '\f', '\r':
		return true
	}
	return false
}

// Params returns the parameters in command-line order.
func (c Cmdline) Params() []Param { return c.params }

// Lookup returns the value of the last parameter named key and whether it
// is present at all (a bare flag is present with an empty value).
func (c Cmdline) Lookup(key string) (string, bool) {
	for i := len(c.params) - 1; i >= 0; i-- {
		if c.params[i].Key == key {
			return c.params[i].Value, true
		}
	}
	return "", false
}

// Get returns the value of key, or def when key is absent or has an
// empty value.
func (c Cmdline) Get(key, def string) string {
	if v, ok := c.Lookup(key); ok && v != "" {
		return v
	}
	return def
}

// Bool reports whether key is set to a true value: a bare flag, "1", "y",
// "yes", "on" or "true" (case-insensitive).
func (c Cmdline) Bool(key string) bool {
	return c.is(key, "", "1", "y", "yes", "on", "true")
}

// False reports whether key is set to a false value: "0", "n", "no",
// "off" or "false" (case-insensitive). An absent key is not false, so
// False gives default-on options.
func (c Cmdline) False(key string) bool {
	return c.is(key, "0", "n", "no", "off", "false")
}

// is reports whether key is present with one of values (which are lower
// case), compared case-insensitively.
func (c Cmdline) is(key string, values ...string) bool {
	v, ok := c.Lookup(key)
	return ok && slices.Contains(values, strings.ToLower(v))
}

// validOr checks *v, the value of the command-line key, with valid; an
// invalid value is replaced by def and reported as the error, naming the
// key and the value, so that a bad command line never stops the boot.
func validOr(v *string, key, def string, valid func(string) error) error {
	if err := valid(*v); err != nil {
		bad := *v
		*v = def
		return fmt.Errorf("%s=%q: %w", key, bad, err)
	}
	return nil
}
