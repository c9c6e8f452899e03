tr=/sys/kernel/tracing
[ -d $tr/events ] || mount -t tracefs nodev $tr
echo '(isa == 2 && exit_reason == 127) || (isa == 1 && exit_reason == 2)' > $tr/events/kvm/kvm_exit/filter
echo 1 > $tr/events/kvm/kvm_exit/enable
echo 1 > $tr/tracing_on
./bin/bench-snapshot --skip-incremental --restore-runs 150 --variants eager,qemu --caches warm --restore-timeout 60s --mem 256 --touch-mib 16 --dirty 1 --boot-tries 3 --kernel build/vmlinux --initramfs build/initramfs.cpio --json build/bench-restore-tf.json
echo "== L2 shutdown exits in L1's KVM trace:"
grep -v '^#' $tr/trace
