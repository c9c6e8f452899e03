#!/bin/bash
# PVM density: 16 idle fork children, warren (the whole CLI) vs warren-vmm, alternating,
# /tmp/warren-full and /tmp/warren-vmm being copies of bin/warren and bin/warren-vmm (make warren),
# bin/bench-fork from ./bench/fork.
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-vmm-binary
i=0
for b in full vmm full vmm; do
  i=$((i+1))
  rm -rf build/pvm-$b; mkdir -p build/pvm-$b
  ./bin/bench-fork --warren /tmp/warren-$b --sizes= --skip-qemu --density-max 16 --density-points 16 --density-balloon off \
    --run-timeout 300s --timeout 10m --dir build/pvm-$b --kernel build/vmlinux --initramfs build/initramfs.cpio \
    --json $out/$i-$b.json > $out/$i-$b.txt 2>&1
  echo "run $i $b rc=$? $(date)"
done
# Run 5: warren-vmm with one P (GOMAXPROCS=1 in bench-fork's environment,
# which its VMMs and their fork children inherit):
#   GOMAXPROCS=1 ./bin/bench-fork --warren /tmp/warren-vmm ... --json 5-vmm-gomaxprocs1.json
# The plot:
#   R=bench/results/2026-12-05-vmm-binary; go run ./bench/fork --replot --density-png $R/density.png \
#     "warren 1=$R/1-full.json" "warren-vmm 2=$R/2-vmm.json" "warren 3=$R/3-full.json" \
#     "warren-vmm 4=$R/4-vmm.json" "warren-vmm GOMAXPROCS 1=$R/5-vmm-gomaxprocs1.json"
