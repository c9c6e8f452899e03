// Package cow owns copy-on-write forks of guest memory and disks, and rollback (the Fork and rollback issue).
//
// It is empty until that issue lands; the folder exists so the layout in
// README.md is visible from the start.
package cow
