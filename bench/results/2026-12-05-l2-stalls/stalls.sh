# In L1: Warren boots to ready in a loop; a boot that never gets ready is
# described before it is killed (issue 18's stalls). $1: runs, $2: tag
tr=/sys/kernel/tracing
[ -d $tr/events ] || mount -t tracefs nodev $tr
echo '(isa == 2 && exit_reason == 127) || (isa == 1 && exit_reason == 2)' > $tr/events/kvm/kvm_exit/filter
echo 1 > $tr/events/kvm/kvm_exit/enable
echo 1 > $tr/tracing_on
cat $tr/trace_pipe >> build/l2/stalls-trace-$2.txt &
grep -E ' (__svm_vcpu_run|svm_vcpu_run)' /proc/kallsyms > build/l2/stalls-kallsyms-$2.txt
./bin/bench-boot --skip-qemu --keep-going --runs $1 --timeout 60s --kernel build/vmlinux --initramfs build/initramfs.cpio --json build/l2/stalls-$2.json > build/l2/stalls-$2.txt 2>&1
echo "== L2 shutdown exits in L1's KVM trace:"; cat build/l2/stalls-trace-$2.txt
grep -h "FAILED\|boots failed" build/l2/stalls-$2.txt
exit 0
