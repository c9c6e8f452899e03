package vmmproc

import "io"

// SetCLIMain sets the warren command's entry point the tests drive the
// VMM through (climain_test.go).
func SetCLIMain(f func(args []string, stdin io.Reader, stdout, stderr io.Writer) int) { cliMain = f }
