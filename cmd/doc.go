// Package cmd holds the binaries: cmd/warren (the CLI, whose verbs are in
// cmd/warren/cli), cmd/warren-hostd (the host daemon, hostd/daemon) and
// cmd/warren-rootfs (packs an OCI layout for `make rootfs`). They parse
// flags and wire libraries together; the VMM process that `warren run`,
// `restore`, `fork-child` and `jail-init` run is the library vmmproc.
//
// May import: anything of the module but bench; nothing imports cmd
// (internal/layout checks it).
package cmd
