#!/usr/bin/env bash
# Smoke test of the guest kernel under QEMU with TCG (software emulation; no
# /dev/kvm needed). Boots the kernel with a tiny initramfs (static C init +
# busybox) and checks that it reaches user space and that a reboot from the
# guest makes QEMU exit.
#
#   kernel/test/qemu-smoke.sh BUILD_DIR [CASE...]
#
# BUILD_DIR holds vmlinux, bzImage and System.map (kernel/build.sh output).
# Cases (default: all): pvh-smp1 pvh-smp2 bzimage-smp2 pc-kbd flag-smp2 noflag
#
# QEMU's microvm machine has no i8042: there reboot=k falls through the
# kernel's reboot chain to a jump into the BIOS reset vector, which restarts
# the guest without QEMU seeing a reset (it loops). So microvm cases use
# reboot=t (triple fault, which -no-reboot turns into an exit); pc-kbd checks
# reboot=k through the i8042 of the pc machine. Warren's VMM must emulate the
# i8042 reset (write 0xfe to port 0x64) for reboot=k.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [CASE...]" >&2; exit 2; }
BUILD="$(cd "$1" && pwd)"; shift
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(pvh-smp1 pvh-smp2 bzimage-smp2 pc-kbd flag-smp2 noflag)
TIMEOUT="${SMOKE_TIMEOUT:-180}"

for c in qemu-system-x86_64 gcc cpio; do
	command -v "$c" >/dev/null || { echo "missing $c (apt-get install qemu-system-x86 build-essential cpio busybox-static)" >&2; exit 2; }
done
[ -x /bin/busybox ] || { echo "missing /bin/busybox (apt-get install busybox-static)" >&2; exit 2; }
if command -v file >/dev/null && ! file -L /bin/busybox | grep -q 'static'; then
	echo "note: /bin/busybox does not look static (install busybox-static)" >&2
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/root/bin"
gcc -static -O2 -Wall -o "$WORK/root/init" "$HERE/init.c"
cp /bin/busybox "$WORK/root/bin/busybox"
install -m 0755 "$HERE/stage2.sh" "$WORK/root/stage2.sh"
(cd "$WORK/root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$WORK/initrd.cpio"
LSTAR="0x$(awk '$3 == "entry_SYSCALL_64" { print $1 }' "$BUILD/System.map")"
[ "$LSTAR" != "0x" ] || { echo "entry_SYSCALL_64 not in System.map" >&2; exit 2; }

BASE_APPEND="console=ttyS0 panic=-1 quiet loglevel=4"
fail=0
run_case() {
	local name="$1" machine kernel smp append
	machine="microvm"; kernel="$BUILD/vmlinux"; smp=1; append="$BASE_APPEND reboot=t"
	case "$name" in
	pvh-smp1) ;;
	pvh-smp2) smp=2 ;;
	bzimage-smp2) kernel="$BUILD/bzImage"; smp=2 ;;
	# SeaBIOS's MP table lists one CPU only, so no -smp 2 here.
	pc-kbd) machine="pc"; kernel="$BUILD/bzImage"; append="$BASE_APPEND reboot=k" ;;
	flag-smp2) smp=2; append="$append warren_pvm_native warren_lstar=$LSTAR" ;;
	noflag) append="$append warren_lstar=$LSTAR" ;;
	*) echo "unknown case $name" >&2; return 1 ;;
	esac
	local log="$WORK/$name.log" t0 t1 rc=0
	t0=$(date +%s.%N)
	timeout "$TIMEOUT" qemu-system-x86_64 -accel tcg -M "$machine" -cpu max -smp "$smp" -m 256 \
		-nographic -no-reboot -nodefaults -serial stdio \
		-kernel "$kernel" -initrd "$WORK/initrd.cpio" -append "$append" \
		</dev/null >"$log" 2>&1 || rc=$?
	t1=$(date +%s.%N)
	local secs; secs=$(echo "$t1 - $t0" | bc)
	tr -d '\r' < "$log" | grep -E 'WARREN|Kernel panic|BUG|Oops|qemu' | sed "s/^/    [$name] /" || true
	local boots; boots=$(grep -c 'WARREN-INIT rebooting' "$log" || true)
	if [ $rc -eq 0 ] && [ "$boots" -eq 1 ] && ! grep -q 'WARREN-TEST FAIL' "$log" &&
	   { [ "$name" != flag-smp2 ] || grep -q 'WARREN-TEST summary: 0 failure' "$log"; }; then
		printf 'PASS %-13s %s, -smp %s, %s: reached init and QEMU exited on reboot in %.1f s\n' \
			"$name" "$machine" "$smp" "$(basename "$kernel")" "$secs"
	else
		printf 'FAIL %-13s rc=%s after %.1f s; full log:\n' "$name" "$rc" "$secs"
		tr -d '\r' < "$log" | tail -40 | sed 's/^/    /'
		fail=1
	fi
}
for c in "${CASES[@]}"; do run_case "$c"; done
exit $fail
