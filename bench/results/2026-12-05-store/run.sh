#!/bin/sh
# The page store benchmark (bench/store): 16 sandboxes from one 256 MiB
# template, 10 rolling snapshots each, bytes on disk before/after, with the
# guest's writes in runs of 16 pages (main), scattered single pages (worst
# case), and the old 1 MiB chunks (256 pages) for comparison.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-store
go build -o /tmp/bench-store ./bench/store
/tmp/bench-store --mem-mib 256 --run-pages 16 --json $out/runs16-chunk64.json | tee $out/runs16-chunk64.txt
/tmp/bench-store --mem-mib 256 --run-pages 1 --json $out/scattered-chunk64.json | tee $out/scattered-chunk64.txt
/tmp/bench-store --mem-mib 256 --run-pages 16 --chunk-pages 256 --json $out/runs16-chunk256.json | tee $out/runs16-chunk256.txt

# Real guests through warren-hostd (the kernel and initramfs guest, 256 MiB),
# in the nested KVM host (state on L1's tmpfs):
#   CGO_ENABLED=0 go build -o build/tests/bench-store ./bench/store
#   CGO_ENABLED=0 go build -o build/tests/warren-pagestore ./cmd/warren
#   CGO_ENABLED=0 go build -o build/tests/warren-hostd-pagestore ./cmd/warren-hostd
#   bash .ci/kvmhost/run.sh --mem 6144 --timeout 2400 $PWD -- 'mkdir -p /tmp/bs && build/tests/bench-store \
#     --hostd build/tests/warren-hostd-pagestore --warren build/tests/warren-pagestore \
#     --kernel build/vmlinux --initramfs build/initramfs.cpio --dir /tmp/bs \
#     --json bench/results/2026-12-05-store/daemon-nested.json | tee bench/results/2026-12-05-store/daemon-nested.txt'
