#!/usr/bin/env bash
# Runs the KVM packages' prebuilt test binaries inside the nested KVM host
# (.ci/kvmhost), surviving the nested host's own failures.
#
#   .ci/test-kvm.sh STATE_DIR TESTS_DIR PKG... [-- KVMHOST_ARGS...]
#
# The emulated nested host (QEMU TCG running kvm_amd) sometimes dies or
# freezes under the tests' load: a kernel-stack overflow in L1's KVM, a
# soft lockup, a silent stall (.ci/kvmhost/README.md). None of that is a test
# verdict, so when L1 fails (run.sh exits 125, or 124 on a timeout, when
# L1's heartbeat stopped (--frozen-timeout) or when the console has been
# silent for --idle-timeout) this script boots a fresh
# L1 and resumes where the last one stopped: packages that passed are not
# run again, and inside a package the top-level tests that passed are
# skipped (-test.skip). It boots at most $MAX_BOOTS (16) L1s, all within
# $BUDGET (2700) seconds: each boot's timeout is cut to what is left, and
# none starts with less than 300 s left. One boot gets at most $BOOT_TIMEOUT
# (the whole budget by default: a freeze is found by the heartbeat and the
# idle timeout, not by this); a whole run takes about 25 minutes.
#
# Test verdicts are strict: a package that fails is run once more (only its
# failed and not yet run tests), and a second failure fails the build. A
# test silent for the idle timeout while L1's heartbeat goes on has hung:
# L1 is stopped (the test cannot be), and that is a failure of its package
# like any other, not the nested host's; a fresh L1 resumes the run. The
# one exception is a failure explained: the emulated host makes about one
# L2 guest start in a hundred triple-fault (KVM_EXIT_SHUTDOWN; QEMU's L2
# guests as often, in the same L1), always with one signature in L1's KVM
# trace (.ci/kvmhost/l2faults.sh). An attempt whose triple faults all carry it
# does not count toward those two, nor does a boot stall whose guest's vCPU
# was found holding L1's own state (the same emulator's leak, caught before
# it faults), at most twice per package (so a package runs at most four
# times). A triple fault
# without the signature counts like any failure. Every failure stays in
# the log.
#
# Inside L1 this same file runs as `sh .ci/test-kvm.sh --inner` (busybox ash);
# its progress lives in STATE_DIR, which is under the shared directory, so it
# survives L1.
set -u

if [ "${1:-}" = --inner ]; then
	# In L1: $STATE, $TESTS and $PKGS come from run.sh's --env. L1's
	# trace of L2 shutdown exits tells the emulated host's known fault
	# from anything else (l2faults.sh); each attempt's traced exits are
	# appended to its log.
	. .ci/kvmhost/l2faults.sh
	l2trace_start
	for p in $PKGS; do
		key=$(echo "$p" | tr / _)
		if [ -f "$STATE/$key.done" ]; then
			echo "=== package $p: passed in an earlier L1 boot"
			continue
		fi
		# go test's -timeout for the package's binary: the daemon's
		# end-to-end tests build templates from the Debian image (its
		# ext4 base alone takes about 2 minutes here) and boot dozens of
		# guests, far longer than the other packages.
		case $p in
		hostd/daemon) timeout=1500s ;;
		vmmproc) timeout=900s ;;
		*) timeout=400s ;;
		esac
		while :; do
			# Top-level tests that passed in any earlier attempt.
			passed=$(cat "$STATE/$key".log.* 2>/dev/null |
				sed -n 's/^--- PASS: \(Test[A-Za-z0-9_]*\) .*/\1/p' | sort -u | tr '\n' '|')
			passed=${passed%|}
			n=$(ls "$STATE/$key".log.* 2>/dev/null | wc -l)
			log=$STATE/$key.log.$((n + 1))
			rm -f "$STATE/$key.rc"
			# Which package is running, for the outer half when L1 is
			# stopped for silence (a hung test: a failure of this package).
			echo "$p" >"$STATE/running"
			if [ -n "$passed" ]; then
				echo "=== package $p (nested KVM), attempt $((n + 1)); skipping tests passed before: $passed"
				{ (cd "$p" && "$TESTS/$key.test" -test.count=1 -test.v -test.timeout "$timeout" -test.skip "^($passed)\$"); echo $? >"$STATE/$key.rc"; } 2>&1 | tee "$log"
			else
				echo "=== package $p (nested KVM), attempt $((n + 1))"
				{ (cd "$p" && "$TESTS/$key.test" -test.count=1 -test.v -test.timeout "$timeout"); echo $? >"$STATE/$key.rc"; } 2>&1 | tee "$log"
			fi
			rc=$(cat "$STATE/$key.rc" 2>/dev/null || echo 1)
			rm -f "$STATE/running"
			l2trace_dump | tee -a "$log"
			if [ "$rc" = 0 ]; then
				touch "$STATE/$key.done"
				break
			fi
			# An attempt whose only L2 failures are the emulated host's
			# known fault (l2_explained) is excused at most twice per
			# package; any other failure counts at once.
			if why=$(l2_explained "$log"); then
				shutdowns=$(($(cat "$STATE/$key.shutdowns" 2>/dev/null || echo 0) + 1))
				echo "$shutdowns" >"$STATE/$key.shutdowns"
				if [ "$shutdowns" -le 2 ]; then
					echo "=== FLAKY? package $p: $why (excused $shutdowns of 2 times); running its failed and remaining tests again"
					continue
				fi
			elif [ -n "$why" ]; then
				echo "=== package $p: not excused: $why"
			fi
			fails=$(($(cat "$STATE/$key.fails" 2>/dev/null || echo 0) + 1))
			echo "$fails" >"$STATE/$key.fails"
			if [ "$fails" -ge 2 ]; then
				echo "=== package $p failed twice in the nested KVM host: failing the build"
				exit 1
			fi
			echo "=== FLAKY? package $p failed in the nested KVM host; running its failed and remaining tests once more (a second failure fails the build)"
		done
	done
	exit 0
fi

[ $# -ge 3 ] || {
	echo "usage: $0 STATE_DIR TESTS_DIR PKG... [-- KVMHOST_ARGS...]" >&2
	exit 2
}
STATE=$(realpath -m "$1")
TESTS=$(realpath "$2")
shift 2
PKGS=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
	PKGS+=("$1")
	shift
done
[ "${1:-}" = -- ] && shift
MAX_BOOTS=${MAX_BOOTS:-16}
BUDGET=${BUDGET:-2700}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-2700}
# CI's whole run must end within an hour: .ci/run sets WARREN_CI_DEADLINE
# (seconds since the epoch), and the budget ends 90 s before it, leaving
# time for the summaries.
if [ -n "${WARREN_CI_DEADLINE:-}" ]; then
	until_deadline=$((WARREN_CI_DEADLINE - $(date +%s) - 90))
	((until_deadline < BUDGET)) && BUDGET=$until_deadline
	echo "test-kvm: $BUDGET s for the nested KVM host (CI deadline $(date -u -d "@$WARREN_CI_DEADLINE" +%T) UTC)"
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# What boots L1 and runs a command there (a stand-in in this script's own
# test, internal/kvmtest's TestKVMRunVerdicts).
RUN_SH=${WARREN_KVMHOST_RUN:-$ROOT/.ci/kvmhost/run.sh}

rm -rf "$STATE"
mkdir -p "$STATE"
start=$SECONDS
# summary prints one line per L1 boot: how long it lived, how it ended
# (run.sh's error, or L1's own BUG/panic line) and the test it was in.
# It comes last, so that CI's tail of the log shows why boots were lost.
summary() {
	local b f
	echo "test-kvm: L1 boots:"
	for ((b = 1; b <= boot && b <= MAX_BOOTS; b++)); do
		f=$STATE/boot$b
		[ -f "$f.rc" ] || continue
		printf '  boot %d: %s s, exit %s; %s; last test started: %s\n' "$b" "$(cat "$f.secs")" "$(cat "$f.rc")" \
			"$(grep -a -m1 -E 'BUG:|Kernel panic|soft lockup|kvmhost: error' "$f.log" | sed 's/^\[ *[0-9.]*\] //' | cut -c1-150 || true)" \
			"$(grep -a -E '^=== (RUN|package)' "$f.log" | tail -n1 | cut -c1-100)"
	done
}
for ((boot = 1; boot <= MAX_BOOTS; boot++)); do
	# No boot may run past the budget (run.sh takes the last --timeout).
	left=$((BUDGET - (SECONDS - start)))
	((left < BOOT_TIMEOUT)) || left=$BOOT_TIMEOUT
	t0=$SECONDS
	# Its output is kept (and shown as it comes) for the summary.
	bash "$RUN_SH" "$@" --timeout "$left" \
		--env "STATE=$STATE" --env "TESTS=$TESTS" --env "PKGS=${PKGS[*]}" \
		"$ROOT" -- 'sh .ci/test-kvm.sh --inner' 2>&1 | tee "$STATE/boot$boot.log"
	rc=${PIPESTATUS[0]}
	echo "$rc" >"$STATE/boot$boot.rc"
	echo $((SECONDS - t0)) >"$STATE/boot$boot.secs"
	case $rc in
	124 | 125) ;;
	*)
		((boot > 1)) && summary
		exit "$rc"
		;;
	esac
	# Stopped because the test printed nothing for the idle timeout while
	# L1's heartbeat went on: L1 was alive, so a test hung. Every test
	# bounds its own waits far below that (a boot or an exec fails, with
	# the guest described, within 4 minutes), so this is a test failure of
	# the package that was running, counted like any other.
	hung=
	if grep -q 'printed nothing for .*taking L1 for frozen' "$STATE/boot$boot.log" && [ -s "$STATE/running" ]; then
		hung=1
		p=$(cat "$STATE/running")
		key=$(echo "$p" | tr / _)
		rm -f "$STATE/running"
		fails=$(($(cat "$STATE/$key.fails" 2>/dev/null || echo 0) + 1))
		echo "$fails" >"$STATE/$key.fails"
		echo "=== package $p: a test printed nothing while L1 lived (last started: $(grep -a -E '^=== RUN' "$STATE/boot$boot.log" | tail -n1 | sed 's/^=== RUN *//' | cut -c1-100)): a hung test, a test failure"
		if ((fails >= 2)); then
			echo "=== package $p failed twice in the nested KVM host: failing the build"
			summary
			exit 1
		fi
	fi
	done_pkgs=$(cd "$STATE" && ls -- *.done 2>/dev/null | sed 's/\.done$//' | tr '\n' ' ')
	if [ -n "$hung" ]; then
		echo "test-kvm: L1 was stopped in boot $boot for a hung test (counted above); packages done: ${done_pkgs:-none}"
	else
		echo "test-kvm: the nested KVM host failed or froze in boot $boot (exit $rc, not a test verdict); packages done: ${done_pkgs:-none}"
	fi
	if ((boot == MAX_BOOTS)); then
		echo "test-kvm: giving up after $MAX_BOOTS L1 boots"
		break
	fi
	if ((BUDGET - (SECONDS - start) < 300)); then
		echo "test-kvm: giving up: $((SECONDS - start)) s spent of the ${BUDGET} s budget"
		break
	fi
	echo "test-kvm: booting a fresh L1 and resuming"
done
summary
exit 125
