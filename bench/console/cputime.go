package console

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat times (100 on Linux).
const clockTicks = 100

// cpuTime reads utime+stime of pid from /proc.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStat(string(b))
}

// parseStat returns the VMM's own CPU time from a stat line: utime + stime
// (fields 14 and 15) less guest_time (field 43), the time vCPU threads spent
// running the guest, which the kernel counts inside utime. The command name
// (field 2) may contain spaces and parentheses.
func parseStat(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("console: malformed stat line")
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("console: short stat line")
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	k, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("console: bad stat times")
	}
	var guest uint64
	if len(f) > 40 {
		guest, _ = strconv.ParseUint(f[40], 10, 64)
	}
	if guest > u {
		guest = u
	}
	return time.Duration(u-guest+k) * time.Second / clockTicks, nil
}
