# In L1: what L1's trace says for deliberate L2 triple faults.
tr=/sys/kernel/tracing
[ -d $tr/events ] || mount -t tracefs nodev $tr
echo '(isa == 2 && exit_reason == 127) || (isa == 1 && exit_reason == 2)' > $tr/events/kvm/kvm_exit/filter
echo 1 > $tr/events/kvm/kvm_exit/enable
echo 1 > $tr/tracing_on
echo > $tr/trace
echo "== 1: a 32-bit guest without paging: lidt limit 0; int3"
timeout 60 ./build/l2/warren-new run --kernel build/l2/triple.elf --mem 64 2>&1 | tail -3
grep -v '^#' $tr/trace; echo > $tr/trace
echo "== 2: Linux panics (no init), panic=1 reboots with reboot=t (the triple-fault method)"
timeout 120 ./build/l2/warren-new run --kernel build/vmlinux --initramfs build/initramfs.cpio --mem 256 --cmdline "reboot=t rdinit=/nonexistent" 2>&1 | tail -4
grep -v '^#' $tr/trace; echo > $tr/trace
echo "== 3: the same under QEMU (-no-reboot)"
timeout 120 qemu-system-x86_64 -M microvm,acpi=off -accel kvm -cpu host,-arch-capabilities -m 256 -smp 1 -nodefaults -no-user-config -nographic -no-reboot -serial stdio -kernel build/vmlinux -initrd build/initramfs.cpio -append "console=ttyS0 reboot=t panic=1 rdinit=/nonexistent" 2>&1 | tail -4
grep -v '^#' $tr/trace
exit 0
