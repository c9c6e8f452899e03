#!/bin/sh
# The page store benchmark (bench/store) with templates' layers in the
# store (hostd/daemon templatepages.go): 16 sandboxes from one 256 MiB
# template, 10 rolling snapshots each, the guest's writes in runs of 16
# pages, chunks of 64 pages (the configuration of ../2026-12-05-store's
# runs16-chunk64, which kept the template's layer out of the store).
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-05-store-templates
go build -o /tmp/bench-store ./bench/store
/tmp/bench-store --mem-mib 256 --run-pages 16 --json $out/runs16-chunk64.json | tee $out/runs16-chunk64.txt
