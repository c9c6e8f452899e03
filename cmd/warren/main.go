// Command warren runs and manages Warren microVMs.
//
// Usage:
//
//	warren run --kernel K [--initramfs I] [--mem MiB] [--cpus N] [--cmdline ARGS] [--console FILE]
//
// run boots a VM, streams its console, and exits 0 when the guest powers off
// (non-zero with a message on a triple fault, a KVM error or a guest panic).
package main

import (
	"os"

	"github.com/warrenvm/warren/cmd/warren/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
