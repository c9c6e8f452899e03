#!/bin/bash
# rounds.sh BENCH_AGENT BASE_WARREN NEW_WARREN OUTDIR [ROUNDS]: alternating
# rounds of bench/agent in one nested host, the baseline VMM then the new
# one, each writing roundN-{before,after}.{txt,json,png} to OUTDIR. Run it
# as .ci/kvmhost/run.sh --host-root $PWD -- bash THIS ...
set -u
bench=$1 base=$2 new=$3 out=$4 rounds=${5:-3}
mkdir -p "$out"
for r in $(seq "$rounds"); do
	for v in before after; do
		bin=$base
		[ $v = after ] && bin=$new
		"$bench" --warren "$bin" --calls 100 --json "$out/round$r-$v.json" --plot "$out/round$r-$v.png" >"$out/round$r-$v.txt" 2>&1
		echo "round$r-$v rc=$?"
		grep -A1 '^vmm cpu' "$out/round$r-$v.txt"
	done
done
