// Package fleettest starts the real servers the fleet tests run against:
// etcd and kube-apiserver (StartKube) and an S3-compatible object store,
// SeaweedFS (StartS3), each a process of its own on loopback ports with
// its state in the test's temporary directory. No fake stands in for any
// of them.
//
// The binaries come from Tools: $WARREN_KUBETOOLS, else build/kubetools
// in the clone, both made by `make kubetools` (.ci/kubetools/build.sh;
// built once per machine and cached). A test that finds neither skips,
// saying how to build them.
//
// Every server a test starts is stopped when the test ends (SIGTERM, then
// SIGKILL), and dies with the test binary if that exits first (the
// parent-death signal); when the test failed, the end of each server's log
// is printed. Servers listen on 127.0.0.1 only, unless the test names
// another address of its own (StartKubeWith, StartS3With: for clients in
// network namespaces the test made, reaching it over their links).
//
// Beside the servers: kubectl (Kubectl, Kube.RunKubectl, as any of the
// apiserver's users), the fleet's controller in the test's process
// (StartController), and README.md's fleet section as a test runs it
// (ReadmeFleetRun: its ```sh block read by ShellBlock, a small literal
// subset of the shell, each kubectl line run with kubectl and checked,
// the daemon lines left to the test).
package fleettest
