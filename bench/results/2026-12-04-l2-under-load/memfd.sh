# In L1: experiment B (QEMU on a shared memfd, as Warren), then the fork pause comparison.
tr=/sys/kernel/tracing
[ -d $tr/events ] || mount -t tracefs nodev $tr
echo '(isa == 2 && exit_reason == 127) || (isa == 1 && exit_reason == 2)' > $tr/events/kvm/kvm_exit/filter
echo 1 > $tr/events/kvm/kvm_exit/enable
echo 1 > $tr/tracing_on
# Stream the trace to the shared directory as it comes (an L1 that dies or
# times out keeps what it caught).
cat $tr/trace_pipe >> build/l2/trace-b.txt &
echo "== L1: $(uname -r); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled) shmem $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled)"
./build/l2/bench-boot-memfd --qemu-mem memfd --keep-going --runs $1 --timeout 90s --kernel build/vmlinux --initramfs build/initramfs.cpio --json build/l2/boot-memfd.json
echo "== L2 shutdown exits in L1's KVM trace so far:"; cat build/l2/trace-b.txt
sh build/l2/forkcmp.sh
echo "== L2 shutdown exits in L1's KVM trace, all:"; cat build/l2/trace-b.txt
exit 0
