#!/bin/sh
# The fleet's object store and bundles cut at their memsnap chunks (issue 20,
# item 3: "where the fleet's object store exists, it stores the same chunks").
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-objstore
# Bytes: 16 sandboxes x 10 rolling snapshots from a 256 MiB template, a bundle
# of every snapshot and of the template in one tenant's namespace, cut every
# 4 MiB (bundle version 1) or at the chunks (version 2); also the page
# store's figures for the same workload (bench/store).
go build -o /tmp/bench-store ./bench/store
(cd $out && /tmp/bench-store --mem-mib 256 --sandboxes 16 --snapshots 10 --json runs16-chunk64.json --png objstore.png > runs16-chunk64.txt)
# Time: upload and fetch against a real S3 server (SeaweedFS, from
# build/kubetools: make kubetools) on loopback, 15 runs per version.
WARREN_BENCH_OBJSTORE=$PWD/$out go test ./bench/objstore -run TestTransfer -v -count=1 2>&1 | grep -v '^\s*[IWE]1205' > $out/transfer.txt
