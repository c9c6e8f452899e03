//go:build linux

package guestinit

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/guestinit/agent"
)

// Run is PID 1's whole life. It never returns: PID 1 exiting panics the
// kernel. Failures print "warren-init: error: ..." lines and the boot goes
// on; on the happy path the ready line is the only output.
func Run() {
	// The Go runtime turns SIGTERM, SIGINT, ... into process exit; for
	// PID 1 that would panic the kernel, so ignore them.
	signal.Ignore(unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGTERM,
		unix.SIGUSR1, unix.SIGUSR2, unix.SIGPIPE, unix.SIGALRM)
	reaper := NewReaper()

	if err := devMount.do(); err != nil {
		report(err)
	}
	if err := ensureConsole(); err != nil {
		report(err)
	}
	if err := makeDevLinks(); err != nil {
		report(err)
	}
	for _, m := range earlyMounts {
		if err := m.do(); err != nil {
			report(err)
		}
	}

	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		report(fmt.Errorf("read kernel command line: %w", err))
	}
	cmdline := ParseCmdline(string(b))
	cfg, err := ConfigFromCmdline(cmdline)
	if err != nil {
		report(err)
	}

	// The image root, if one is asked for; on any failure the guest
	// stays on the initramfs, as without warren.root.
	var img *imageRoot
	root, err := RootDiskFromCmdline(cmdline)
	if err != nil {
		report(fmt.Errorf("%w; staying on the initramfs", err))
	}
	if root.Device != "" {
		if readOnly, err := root.switchRoot(); err != nil {
			report(fmt.Errorf("%w; staying on the initramfs", err))
		} else {
			r := setUpImageRoot(readOnly)
			img = &r
		}
	}
	if img == nil {
		for _, m := range initramfsMounts {
			if err := m.do(); err != nil {
				report(err)
			}
		}
	}

	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		report(fmt.Errorf("sethostname %q: %w", cfg.Hostname, err))
	}
	if img != nil {
		if err := img.writeHostFiles(cfg.Hostname); err != nil {
			report(fmt.Errorf("hostname files: %w", err))
		}
	}
	configureNetwork(cmdline)
	mountData(cmdline)
	if img != nil && img.readOnly {
		agent.HostnameEtcDir = "" // a fork's hostname cannot reach /etc there
	}
	if cfg.Agent {
		// After the move: the agent's processes, and the trust store the
		// re-sync loop writes (agent.ApplyTrust), are the image's.
		if err := startAgent(reaper, agentOptions(img)); err != nil && !errors.Is(err, errNoVsock) {
			report(err)
		}
	}

	console(ReadyLine(uptime()))

	if cfg.Poweroff {
		Poweroff()
	} else if cfg.Shell {
		if err := startShell(img); err != nil {
			report(err)
		}
	}
	reaper.Run()
	select {} // not reached
}

// uptime reads /proc/uptime, falling back to CLOCK_BOOTTIME (the clock
// behind /proc/uptime) so that the ready line is always printed.
func uptime() time.Duration {
	b, err := os.ReadFile("/proc/uptime")
	if err == nil {
		var d time.Duration
		if d, err = ParseUptime(string(b)); err == nil {
			return d
		}
	}
	report(fmt.Errorf("read uptime: %w", err))
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// Poweroff syncs and resets the machine. Warren's VMM (and QEMU with
// -no-reboot) treats the i8042 reset that the kernel does for
// LINUX_REBOOT_CMD_RESTART with "reboot=k" as the guest powering off:
// there is no ACPI. It returns only if reboot(2) fails.
func Poweroff() {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		report(fmt.Errorf("reboot: %w", err))
	}
}

func report(err error) { console(ErrorLine(err)) }
