//go:build linux

package guestinit

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ensureConsole makes fds 0, 1 and 2 refer to /dev/console when the kernel
// could not open it for us (an initramfs without a dev/console node). It
// must run after /dev is mounted.
func ensureConsole() error {
	if _, err := unix.FcntlInt(1, unix.F_GETFD, 0); err == nil {
		return nil // the kernel gave us a console
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/console: %w", err)
	}
	for target := 0; target <= 2; target++ {
		if fd == target {
			// Already in place, but opened close-on-exec: clear it.
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
				return fmt.Errorf("console fd %d: %w", fd, err)
			}
			continue
		}
		if err := unix.Dup3(fd, target, 0); err != nil {
			return fmt.Errorf("dup console to fd %d: %w", target, err)
		}
	}
	if fd > 2 {
		unix.Close(fd)
	}
	return nil
}

// console writes PID 1's lines to fd 1 with one write(2) per line, so that
// a line is never interleaved with kernel messages mid-way.
func console(line string) {
	os.Stdout.WriteString(line)
}
