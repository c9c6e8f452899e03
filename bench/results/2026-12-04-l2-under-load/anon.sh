# In L1: L2 start failures, Warren against QEMU, with L1's shutdown trace.
# $1: boots per system; $2: forks (and QEMU restores) at 128 MiB; $3: tag
tr=/sys/kernel/tracing
[ -d $tr/events ] || mount -t tracefs nodev $tr
echo '(isa == 2 && exit_reason == 127) || (isa == 1 && exit_reason == 2)' > $tr/events/kvm/kvm_exit/filter
echo 1 > $tr/events/kvm/kvm_exit/enable
echo 1 > $tr/tracing_on
echo "== L1: $(uname -r); kvm_amd npt=$(cat /sys/module/kvm_amd/parameters/npt) vls=$(cat /sys/module/kvm_amd/parameters/vls)"
if [ "$1" -gt 0 ]; then
  ./bin/bench-boot --keep-going --runs $1 --timeout 90s --kernel build/vmlinux --initramfs build/initramfs.cpio --json build/l2/boot-$3.json
  echo "== L2 shutdown exits in L1's KVM trace (boots):"; grep -v '^#' $tr/trace; echo > $tr/trace
fi
if [ "$2" -gt 0 ]; then
  ./bin/bench-fork --sizes 128 --runs $2 --skip-density --run-timeout 60s --kernel build/vmlinux --initramfs build/initramfs.cpio --json build/l2/fork-$3.json
  echo "== L2 shutdown exits in L1's KVM trace (forks):"; grep -v '^#' $tr/trace
fi
