// Package cow owns copy-on-write forks of guest memory and disks, and rollback (the Fork and rollback issue).
//
// Package cow itself is empty until that issue lands; its subpackage disk
// (copy-on-write disk overlays over a shared base image) is the groundwork.
package cow
