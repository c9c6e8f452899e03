// Command warren-vmm is the VMM process alone: the verbs warren-hostd
// starts its VMMs with (run, restore, and fork-child, jail-init and
// jail-spawn, which VMMs start themselves from /proc/self/exe), the same
// code as warren's verbs of those names (cmd/internal/vmmverbs) without
// the rest of the warren command, whose packages every VMM would otherwise
// link, initialise and keep in its private memory. warren-hostd runs it
// when it finds it beside itself (or in PATH), else warren.
//
// Usage:
//
//	warren-vmm run --kernel K [flags]       boot a VM (warren run's flags)
//	warren-vmm restore [flags] DIR/NAME     restore a snapshot (warren restore's flags)
package main

import (
	"fmt"
	"os"

	"github.com/warrenvm/warren/cmd/internal/vmmverbs"
)

const usage = `usage: warren-vmm run|restore [flags] (warren run and warren restore's flags; warren-hostd starts it)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	code, ok := vmmverbs.Run(os.Args[1], os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
	if !ok {
		fmt.Fprintf(os.Stderr, "warren-vmm: unknown command %q\n%s", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}
