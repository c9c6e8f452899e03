// Command warren-hostd is Warren's host daemon: one per KVM host, serving
// the sandbox API (hostd/openapi.yaml) on a unix socket and optionally on
// TCP with bearer tokens. The logic is in hostd/daemon.
package main

import (
	"os"

	"github.com/warrenvm/warren/hostd/daemon"
)

func main() {
	os.Exit(daemon.Main(os.Args[1:], os.Stderr))
}
