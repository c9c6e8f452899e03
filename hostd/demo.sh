#!/bin/bash
# The main job, through warren-hostd and the warren CLI: start the daemon
# on a temporary state directory and socket, build a template from the
# Debian image of `make rootfs` (its layers become an ext4 root file
# system; boot once, snapshot), create a sandbox from it, run Python in it
# and write a file, start a background process, fork it into two children
# that each write their own file, pause and resume it (the process runs
# on), list the sandboxes, delete everything and stop the daemon. `make run` runs it (with /dev/kvm here, or in the nested KVM
# host: see the Makefile); by hand, from the repository root, after
# `make warren hostd kernel initramfs rootfs`: bash hostd/demo.sh
# (WARREN_DEMO_IMAGE=REF uses another image).
set -euo pipefail
ROOT=$(pwd)
S=$(mktemp -d /tmp/warren-demo-XXXXXX)
export WARREN_HOST=$S/hostd.sock WARREN_TENANT=demo
W=$ROOT/bin/warren
# Its VMMs run bin/warren-vmm, which it finds beside itself.
"$ROOT/bin/warren-hostd" --state "$S/state" --socket "$WARREN_HOST" --stop-on-exit \
	--guest-dir "$ROOT/build" --guest-kernel vmlinux --guest-initramfs initramfs.cpio 2>"$S/hostd.log" &
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

IMAGE=${WARREN_DEMO_IMAGE:-oci-layout:$ROOT/build/rootfs/debian:bookworm}

step "template from the image $IMAGE: its layers become an ext4 root file system; boot once, snapshot"
TPL=$(show "$W" templates create --image "$IMAGE" --mem 512 --cpus 1)
echo "$TPL"
show "$W" templates
show "$W" images

step "a sandbox from $TPL: Python runs in it"
SB=$(show "$W" create --template "$TPL" --name demo)
echo "$SB"
show "$W" exec "$SB" -- python3 -c 'import platform, sys; print(f"python {platform.python_version()} on {platform.system()}: 6*7 =", 6*7)'
show "$W" exec "$SB" -- sh -c 'cat /etc/debian_version; echo "agent notes" > /root/notes.txt; ls -l /root'

step "a background process in $SB: it gets an id and outlives this command (and, below, a fork, a pause and a resume)"
PROC=$(show "$W" exec -d "$SB" -- sh -c 'i=0; while [ $i -lt 600 ]; do echo "tick $i"; i=$((i+1)); sleep 1; done')
echo "$PROC"

step "fork $SB into 2: each child writes its own file"
KIDS=$(show "$W" fork -n 2 "$SB")
echo "$KIDS"
for k in $KIDS; do
	show "$W" exec "$k" -- sh -c "hostname > /root/child-\$(hostname).txt"
done
for k in $KIDS; do
	show "$W" exec "$k" -- sh -c 'echo "$(hostname): $(ls /root | tr "\n" " ")"'
done
show "$W" exec "$SB" -- sh -c 'echo "parent: $(ls /root | tr "\n" " ")"'

step "pause, resume"
show "$W" pause "$SB"
show "$W" resume "$SB"
show "$W" exec demo -- python3 -c 'print(open("/root/notes.txt").read().strip(), "- still there")'
show "$W" ps demo
show "$W" logs demo "$PROC" | tail -n 2
show "$W" ls

step "cleanup"
show "$W" rm $KIDS "$SB"
show "$W" templates rm "$TPL"
show "$W" ls
