# In L1: Warren's guest RAM on 4 KiB shmem pages against THP-backed shmem (issue 18).
# $1: boots per system
tr=/sys/kernel/tracing
[ -d $tr/events ] || mount -t tracefs nodev $tr
echo '(isa == 2 && exit_reason == 127) || (isa == 1 && exit_reason == 2)' > $tr/events/kvm/kvm_exit/filter
echo 1 > $tr/events/kvm/kvm_exit/enable
echo 1 > $tr/tracing_on
cat $tr/trace_pipe >> build/l2/trace-thp.txt &
echo advise > /sys/kernel/mm/transparent_hugepage/shmem_enabled
echo "== L1: $(uname -r); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled) shmem $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled)"
# Check that the advice takes: ShmemPmdMapped while a warren-thp guest runs.
for v in 0 1; do
  WARREN_GUEST_THP=$v ./bin/warren run --kernel build/vmlinux --initramfs build/initramfs.cpio --mem 256 --cmdline warren.poweroff=1 > build/l2/thp-check-$v.txt 2>&1 &
  pid=$!; for t in 1 2 3 4 5 6; do sleep 0.5; echo "WARREN_GUEST_THP=$v at ${t}x0.5s: $(grep -E 'ShmemHugePages|ShmemPmdMapped' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"; done; wait $pid
done
./bin/bench-boot --systems warren,warren-thp --keep-going --runs $1 --timeout 90s --kernel build/vmlinux --initramfs build/initramfs.cpio --json build/l2/boot-thp.json
echo "== L2 shutdown exits in L1's KVM trace:"; cat build/l2/trace-thp.txt
exit 0
