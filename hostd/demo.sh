#!/bin/bash
# The main job, through warren-hostd and the warren CLI: start the daemon
# on a temporary state directory and socket, build a template (boot once,
# snapshot), create a sandbox from it, run a command in it, fork it and run
# a command in a child, pause and resume it, list the sandboxes, delete
# everything and stop the daemon. `make run` runs it (with /dev/kvm here, or
# in the nested KVM host: see the Makefile); by hand, from the repository
# root, after `make warren hostd kernel initramfs`: bash hostd/demo.sh
set -euo pipefail
ROOT=$(pwd)
S=$(mktemp -d /tmp/warren-demo-XXXXXX)
export WARREN_HOST=$S/hostd.sock WARREN_TENANT=demo
W=$ROOT/bin/warren
"$ROOT/bin/warren-hostd" --state "$S/state" --socket "$WARREN_HOST" --warren "$W" --stop-on-exit 2>"$S/hostd.log" &
HOSTD=$!
cleanup() {
	local rc=$?
	kill "$HOSTD" 2>/dev/null && wait "$HOSTD" 2>/dev/null
	if [ $rc -ne 0 ]; then
		echo "demo failed (exit $rc); the daemon's log:"
		tail -n 30 "$S/hostd.log"
	fi
	echo "state, daemon log and audit log: $S"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$WARREN_HOST" ] && break; sleep 0.1; done
step() { printf '\n== %s\n' "$*" >&2; }
# show prints a command (on stderr, so that $(show ...) captures only its
# output) and runs it.
show() {
	local a line=\$
	for a in "${1#$ROOT/bin/}" "${@:2}"; do
		case $a in *[\ \$\(\)\'\"]*) a="'$a'" ;; esac
		line+=" $a"
	done
	printf '%s\n' "$line" >&2
	"$@"
}

step "template: boot the guest once, wait for its agent, snapshot it"
TPL=$(show "$W" templates create --kernel build/vmlinux --initramfs build/initramfs.cpio --mem 256 --cpus 1)
echo "$TPL"
show "$W" templates

step "a sandbox from $TPL"
SB=$(show "$W" create --template "$TPL" --mem 512 --name demo)
echo "$SB"
show "$W" exec "$SB" -- sh -c 'echo hello from $(cat /proc/sys/kernel/hostname)'

step "fork $SB into 2"
KIDS=$(show "$W" fork -n 2 "$SB")
echo "$KIDS"
for k in $KIDS; do show "$W" exec "$k" -- sh -c 'echo child $(cat /proc/sys/kernel/hostname)'; done

step "pause, resume"
show "$W" pause "$SB"
show "$W" resume "$SB"
show "$W" exec demo -- sh -c 'echo still alive'
show "$W" ls

step "cleanup"
show "$W" rm "$SB" $KIDS
show "$W" templates rm "$TPL"
show "$W" ls
