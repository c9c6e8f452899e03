package boot

import (
	"fmt"
	"strings"
)

// Cmdline is a kernel command line assembled from parts in order.
type Cmdline struct {
	parts []string
}

// Add appends whitespace-separated parameters; empty strings are ignored.
func (c *Cmdline) Add(params ...string) {
	for _, p := range params {
		c.parts = append(c.parts, strings.Fields(p)...)
	}
}

// Has reports whether a parameter with this key (the text before '=', or the
// whole flag) is present.
func (c *Cmdline) Has(key string) bool {
	for _, p := range c.parts {
		k, _, _ := strings.Cut(p, "=")
		if k == key {
			return true
		}
	}
	return false
}

// String returns the command line.
func (c *Cmdline) String() string { return strings.Join(c.parts, " ") }

// Validate checks length and characters: the kernel needs it NUL-terminated
// within MaxCmdline bytes.
func (c *Cmdline) Validate() error {
	s := c.String()
	if len(s)+1 > MaxCmdline {
		return fmt.Errorf("boot: kernel command line is %d bytes, at most %d", len(s), MaxCmdline-1)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("boot: kernel command line contains a NUL byte")
	}
	return nil
}
