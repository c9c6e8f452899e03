#!/bin/bash
# The "main job" through warren-hostd: start the daemon, build a
# template (boot once, snapshot), create a sandbox from it, run a command in
# it, fork it, pause and resume it, and stop the daemon (the VMMs are
# deleted first). Needs /dev/kvm, curl and jq; run from the repository root
# after `make warren kernel initramfs` and
# `CGO_ENABLED=0 go build -o bin/warren-hostd ./cmd/warren-hostd`.
# Without /dev/kvm: bash .ci/kvmhost/run.sh --host-root $PWD -- bash hostd/daemon/demo.sh
set -euo pipefail
ROOT=$(pwd)
S=$(mktemp -d /tmp/warren-demo-XXXXXX)
./bin/warren-hostd --state "$S/state" --socket "$S/hostd.sock" --warren "$ROOT/bin/warren" --cgroup-root /sys/fs/cgroup 2>"$S/hostd.log" &
HOSTD=$!
trap 'kill $HOSTD 2>/dev/null; wait $HOSTD 2>/dev/null; echo "daemon log: $S/hostd.log"' EXIT
for _ in $(seq 50); do [ -S "$S/hostd.sock" ] && break; sleep 0.1; done
export JQ_COLORS= NO_COLOR=1
jq() { command jq -M "$@"; }
api() { curl -sS --fail-with-body --unix-socket "$S/hostd.sock" -H "X-Warren-Tenant: demo" "$@"; }
# Runs a command in sandbox $1, printing its output.
run() {
	local id=$1; shift
	local argv
	argv=$(for a in "$@"; do jq -n --arg a "$a" '$a'; done | jq -sc '{argv: .}')
	api -d "$argv" "http://hostd/v1/sandboxes/$id/exec" |
		jq -j 'if .stdout then (.stdout|@base64d) elif .stderr then (.stderr|@base64d) elif .exit != null then "(exit \(.exit))\n" else "error: \(.error)\n" end'
}

echo "== template: boot, wait for the agent, snapshot (progress streamed)"
api -H 'Accept: application/x-ndjson' -d "{\"kernel\":\"$ROOT/build/vmlinux\",\"initramfs\":\"$ROOT/build/initramfs.cpio\",\"mem_mib\":256,\"cpus\":1}" \
	http://hostd/v1/templates | tee "$S/template.ndjson" | jq -c .
TPL=$(tail -1 "$S/template.ndjson" | jq -er .result.id)

echo "== sandbox from $TPL"
SB=$(api -d "{\"template\":\"$TPL\",\"mem_mib\":512,\"cpus\":1}" http://hostd/v1/sandboxes | jq -er .id)
api "http://hostd/v1/sandboxes/$SB" | jq -c '{id, status, pid, cgroup}'
run "$SB" sh -c 'echo hello from $(cat /proc/sys/kernel/hostname)'

echo "== fork $SB into 2"
KIDS=$(api -d '{"n":2}' "http://hostd/v1/sandboxes/$SB/fork" | jq -er '.children[].id')
for k in $KIDS; do run "$k" cat /proc/sys/kernel/hostname; done

echo "== pause, resume"
api -X POST "http://hostd/v1/sandboxes/$SB/pause" | jq -c '{id, status}'
api -X POST "http://hostd/v1/sandboxes/$SB/resume" | jq -c '{id, status}'
run "$SB" sh -c 'echo still alive'

echo "== cleanup"
for id in $SB $KIDS; do api -X DELETE "http://hostd/v1/sandboxes/$id" | jq -c .; done
api -X DELETE "http://hostd/v1/templates/$TPL" | jq -c .
