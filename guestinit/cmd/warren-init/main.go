// Command warren-init is the guest's PID 1; see package guestinit.
package main

import (
	"fmt"
	"os"

	"github.com/warrenvm/warren/guestinit"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "warren-init: error: must run as PID 1")
		os.Exit(1)
	}
	guestinit.Run()
}
