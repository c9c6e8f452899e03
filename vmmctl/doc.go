// Package vmmctl is the one contract of a VMM process's control API (the
// unix socket of `warren run|restore --api PATH`, and of every fork
// child): the request and reply bodies of POST /v1/pause, /v1/resume,
// /v1/snapshot, /v1/rollback and /v1/fork, GET /v1/disks, and GET and PUT
// /v1/egress, and the typed Client that warren-hostd, the warren CLI and
// the benchmarks call it with. The VMM process (vmmproc's api.go)
// serves exactly these types. SnapshotEvery (schedule.go) is the
// client's rolling snapshots (`warren snapshot --every`).
//
// It is also the contract of a VMM process's start: Launch (launch.go)
// is what warren-hostd asks a VMM to be (`warren run` for a template's
// build, `warren restore` for a sandbox), and Launch.Args its one
// encoder into the warren binary's command line, which the binary
// decodes with vmmproc.ParseRunArgs and ParseRestoreArgs; Jail
// (jail.go) is the confinement a VMM enters once set up, with its one
// encoder and decoder (Encode, ParseJail); JailInit (jailinit.go) is
// `warren jail-init`, the confined VMM's pid 1 that starts it, encoded by
// Args and decoded by vmmproc.ParseJailInitArgs. warren-hostd builds no
// argv of its own.
//
// Errors: a refusal is an answer with a non-200 status and an ErrorReply
// body; the Client returns it as an *Error carrying the status (409: the
// VM refuses in its current state).
//
// May import: cow, memsnap, ebpf, vmm, devices, internal (the VMM
// process's layer, below hostd; internal/layout checks it).
package vmmctl
