#!/bin/bash
# profile.sh BENCH_AGENT WARREN OUTDIR [perf|strace]...: runs bench/agent
# (both VMs, as the benchmark does) once per mode and, once Warren's agent
# answers, attaches to Warren's VMM process for the rest of the run (the 3 s
# idle sample and every call): perf record (cpu-clock, frame-pointer call
# graphs) or strace -c -f (syscall counts of all its threads). Run in the
# nested host: .ci/kvmhost/run.sh --host-root $PWD -- bash THIS ...
# Calls per attach: 2 operations x (CALLS + 10 warm-up).
set -u
bench=$1 warren=$2 out=$3
shift 3
calls=${CALLS:-60}
mkdir -p "$out"
for mode in "$@"; do
	log=$out/bench-$mode.txt
	"$bench" --warren "$warren" --calls "$calls" >"$log" 2>&1 &
	bpid=$!
	until grep -q '^warren: vCPU threads' "$log"; do
		kill -0 $bpid 2>/dev/null || { echo "bench exited early"; cat "$log"; exit 1; }
		sleep 0.2
	done
	pid=$(pgrep -f "^$warren run" | head -1)
	echo "$mode: warren pid $pid; calls attached: $((2 * (calls + 10)))"
	case $mode in
	perf)
		perf record -q -e cpu-clock -F 2000 -g -p "$pid" -o "$out/perf.data" >"$out/perf-record.log" 2>&1 &
		tpid=$! ;;
	strace)
		strace -c -f -p "$pid" -o "$out/strace.txt" >"$out/strace.log" 2>&1 &
		tpid=$! ;;
	esac
	wait $bpid
	sleep 1
	kill -INT $tpid 2>/dev/null
	wait $tpid
	case $mode in
	perf)
		# The vCPU thread (the one that ran guest code) is left out of the
		# per-symbol reports: the benchmark does not count it either.
		vcpu=$(sed -n 's/^warren: vCPU threads \[\([0-9]*\)(.*/\1/p' "$log")
		perf report -i "$out/perf.data" --stdio --no-children --sort pid -g none 2>/dev/null | head -40 >"$out/perf-threads.txt"
		tids=$(perf report -i "$out/perf.data" --stdio --no-children --sort pid -g none 2>/dev/null |
			sed -n 's/^ *[0-9.]*% *\([0-9]*\):.*/\1/p' | grep -vx "$vcpu" | paste -sd,)
		perf report -i "$out/perf.data" --stdio --no-children --tid "$tids" --sort sym -g none 2>/dev/null | head -150 >"$out/perf-flat.txt"
		perf report -i "$out/perf.data" --stdio --children --tid "$tids" --sort sym -g none 2>/dev/null | head -250 >"$out/perf-children.txt"
		rm -f "$out/perf.data" ;;
	esac
	grep -A3 'vmm cpu' "$log" | head -8
done
