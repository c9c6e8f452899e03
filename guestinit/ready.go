package guestinit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ReadyPrefix starts the one line PID 1 prints when the guest is up. Hosts
// wait for it on the serial console.
const ReadyPrefix = "warren-init: ready"

// ParseUptime parses the first field of /proc/uptime ("61.42 3.10\n") into
// a duration. The kernel prints seconds with exactly two decimals; fewer
// or none are accepted too. Parsing is exact (no floating point).
func ParseUptime(s string) (time.Duration, error) {
	f, _, _ := strings.Cut(strings.TrimSpace(s), " ")
	if f == "" {
		return 0, fmt.Errorf("parse uptime: empty")
	}
	secStr, fracStr, _ := strings.Cut(f, ".")
	if secStr == "" || len(fracStr) > 9 {
		return 0, fmt.Errorf("parse uptime %q: bad format", f)
	}
	sec, err := strconv.ParseUint(secStr, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("parse uptime %q: %w", f, err)
	}
	var ns uint64
	if fracStr != "" {
		frac, err := strconv.ParseUint(fracStr, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("parse uptime %q: %w", f, err)
		}
		ns = frac
		for i := len(fracStr); i < 9; i++ {
			ns *= 10
		}
	}
	return time.Duration(sec)*time.Second + time.Duration(ns), nil
}

// ReadyLine formats the ready line, newline included, with the uptime in
// seconds truncated to two decimals: "warren-init: ready uptime=61.42\n".
func ReadyLine(uptime time.Duration) string {
	if uptime < 0 {
		uptime = 0
	}
	cs := uptime / (10 * time.Millisecond)
	return fmt.Sprintf("%s uptime=%d.%02d\n", ReadyPrefix, cs/100, cs%100)
}

// ErrorLine formats an error line, newline included.
func ErrorLine(err error) string {
	return "warren-init: error: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n"
}
