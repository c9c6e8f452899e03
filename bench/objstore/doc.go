// Package objstore measures what cutting a bundle's memory at its memsnap
// chunks (hostd/daemon bundles, version 2) costs and saves in the fleet's
// object store (fleet/objstore) against cutting it every 4 MiB (version
// 1): the time to upload a template's bundle, then a snapshot's bundle of
// a sandbox made from it (its memory 1.5 % rewritten), and to fetch that
// snapshot's bundle back (on a host with no cache, and on one that
// fetched the template's bundle before and keeps objects in its cache, as
// warren-hostd does), with the blobs and bytes each leaves in the
// bucket, against a real S3 server (SeaweedFS, started by the test as
// fleet/fleettest starts it for the fleet's tests).
//
// It is a test gated by an environment variable, because the S3 server
// is a test fixture (fleet/fleettest); it prints p50/p90/p99 of each
// version side by side with their ratio, and writes transfer.json and
// transfer.png into the directory the variable names:
//
//	WARREN_BENCH_OBJSTORE=bench/results/DIR go test ./bench/objstore -run TestTransfer -v -count=1
//
// The bundles hold memory only (a real bundle adds its state, a few
// records and its disks, cut as in both versions). The server runs on
// loopback on the same host, so a request's round trip is short: with a
// remote object store each of version 2's more numerous requests costs
// more, which fleet/objstore.Parallel overlaps.
package objstore
