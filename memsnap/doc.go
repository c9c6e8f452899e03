// Package memsnap owns memory snapshots: full and dirty-page incremental layers, zstd-compressed, and restore (the Snapshots issue).
//
// It is empty until that issue lands; the folder exists so the layout in
// README.md is visible from the start.
package memsnap
