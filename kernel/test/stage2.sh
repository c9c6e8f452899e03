#!/bin/busybox sh
# Second stage of the smoke-test initramfs: a #! script (BINFMT_SCRIPT) run by
# busybox, then a reboot that must make QEMU (-no-reboot) exit.
/bin/busybox echo "WARREN-INIT busybox sh runs: $(/bin/busybox uname -sr), $(/bin/busybox grep -c ^processor /proc/cpuinfo) processor(s), uptime $(/bin/busybox cut -d' ' -f1 /proc/uptime) s"
/bin/busybox echo "WARREN-INIT rebooting"
/bin/busybox reboot -f
