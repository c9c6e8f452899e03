package vmmproc_test

// The end-to-end tests of the VMM process drive it through the warren
// command, as a user does. cmd/warren/cli imports vmmproc, so only an
// external test package may import it: it hands cli.Main to the tests
// (package vmmproc) before TestMain runs. This is a test's import only;
// vmmproc's code never imports cmd (internal/layout).

import (
	"github.com/warrenvm/warren/cmd/warren/cli"
	"github.com/warrenvm/warren/vmmproc"
)

func init() { vmmproc.SetCLIMain(cli.Main) }
