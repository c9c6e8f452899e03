# l2faults.sh: sourced (POSIX sh; busybox ash in L1) by what runs tests in
# the nested KVM host, to tell the emulated host's known L2 fault from
# anything else. Functions:
#
#   l2trace_start   turn on L1's kvm:kvm_exit tracepoint, filtered to the
#                   shutdown exits of L2 guests (SVM exit 0x7f, VMX's triple
#                   fault 2); sets l2trace to the tracing directory, or to
#                   nothing when L1 cannot trace or WARREN_L2TRACE is off.
#   l2trace_dump    print each shutdown exit traced since the last dump as
#                   "=== L2 shutdown exit (triple fault) in L1's KVM trace:
#                   LINE (guest kernel: SYMBOL)", and clear the trace.
#   l2_explained LOG
#                   succeed, printing why, when LOG (a test attempt's output
#                   with l2trace_dump's lines appended) shows L2 triple
#                   faults that are all the emulated host's known fault, or
#                   boot stalls and no triple fault, each stall with a vCPU
#                   found in L1's own state; otherwise fail, printing why
#                   (nothing when LOG shows no L2 failure).
#
# Why the trace: KVM resets the vCPU on the shutdown intercept before the
# VMM sees KVM_EXIT_SHUTDOWN, so the registers a VMM logs are the reset
# state (rip 0xfff0); the tracepoint records the guest's rip at the exit and
# the event it was delivering.
#
# The known fault: every shutdown exit the trace has caught was delivering a
# page fault (intr_info 0x80000b0e: valid, hardware exception, vector 14,
# error code valid) raised by an instruction fetch of a page not present
# (error code 0x10 in the guest kernel, 0x14 in its user mode), at text that
# is always mapped (kernel text; a running program's): the guest's page
# walk read a present entry as absent, which no VMM state can make a correct
# CPU do. The record (rates against QEMU's L2 guests in the same L1, and
# what is still open) is in .ci/kvmhost/README.md, "L2 triple faults".

l2trace_start() {
	l2trace=
	# (Off in the harness's own tests, which run on a development host.)
	[ "${WARREN_L2TRACE:-on}" = off ] && return 0
	l2trace=/sys/kernel/tracing
	[ -d $l2trace/events ] || mount -t tracefs nodev $l2trace 2>/dev/null
	if [ -w $l2trace/events/kvm/kvm_exit/filter ] &&
		echo '(isa == 2 && exit_reason == 127) || (isa == 1 && exit_reason == 2)' >$l2trace/events/kvm/kvm_exit/filter &&
		echo 1 >$l2trace/events/kvm/kvm_exit/enable; then
		echo 1 >$l2trace/tracing_on
		echo >$l2trace/trace
	else
		l2trace=
	fi
}

l2trace_dump() {
	[ -n "${l2trace:-}" ] || return 0
	# (grep fails on a trace of comments only: no exit under set -e.)
	{ grep -v '^#' $l2trace/trace || true; } | while read -r line; do
		rip=$(echo "$line" | sed -n 's/.* rip 0x\([0-9a-f]*\).*/\1/p')
		sym=
		if [ -n "$rip" ] && [ -f build/System.map ]; then
			rip=$(printf '%016s' "$rip" | tr ' ' 0)
			sym=$(awk -v r="$rip" '("x" $1) <= ("x" r) && $2 ~ /^[tTwW]$/ { s = $3 } ("x" $1) > ("x" r) { exit } END { print s }' build/System.map)
		fi
		echo "=== L2 shutdown exit (triple fault) in L1's KVM trace: $line${sym:+ (guest kernel: $sym)}"
	done
	echo >$l2trace/trace
}

l2_explained() {
	# Triple faults, each once: a VMM's death is often reported twice (the
	# test's failure and the daemon's log both name "the VMM (pid N)"), so
	# lines naming a pid count once per pid, the others once per line.
	l2tf=$(grep 'triple fault (KVM_EXIT_SHUTDOWN)' "$1" | awk '
		match($0, /\(pid [0-9]+\)/) { pids[substr($0, RSTART, RLENGTH)] = 1; next }
		{ n++ }
		END { for (p in pids) n++; print n + 0 }')
	l2stalls=$(grep -c 'L2 guest boot stalled' "$1")
	[ "$l2tf" -gt 0 ] || [ "$l2stalls" -gt 0 ] || return 1
	if [ "$l2stalls" -gt 0 ] && [ "$l2tf" -eq 0 ]; then
		# A stalled boot is the emulated host's only when a vCPU of the
		# stalled guest was found holding L1's own state (paging on, CR3
		# outside the guest's RAM: the leak README.md's "The fork hang is
		# L1's host state in an L2 vCPU" describes; the test logs
		# hostStateInGuest's line). Any other stall is a test failure.
		l2host=$(grep -c "L2 vCPU holds the emulated host's state" "$1")
		if [ "$l2host" -lt "$l2stalls" ]; then
			echo "$l2stalls L2 boot stall(s), $l2host with a vCPU in the emulated host's state"
			return 1
		fi
		echo "$l2stalls L2 boot stall(s), each with a vCPU holding L1's own state (the emulated nested SVM's leak)"
		return 0
	fi
	if [ -z "${l2trace:-}" ]; then
		echo "$l2tf L2 triple fault(s), and no L1 trace to tell which"
		return 1
	fi
	l2traced=$(grep -c '^=== L2 shutdown exit' "$1")
	l2known=$(grep '^=== L2 shutdown exit' "$1" | grep -c -E 'intr_info 0x80000b0e error_code 0x000000(10|14)( |$)')
	if [ "$l2traced" -lt "$l2tf" ] || [ "$l2known" -ne "$l2traced" ]; then
		echo "$l2tf L2 triple fault(s), $l2traced shutdown exit(s) traced, $l2known of them the known instruction-fetch fault"
		return 1
	fi
	echo "$l2tf L2 triple fault(s), each the emulated host's known instruction-fetch fault (traced)"
}
