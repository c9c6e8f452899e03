package pagestore

import (
	"io/fs"
	"syscall"
)

// fileUID returns the owner of the file st describes.
func fileUID(st fs.FileInfo) (int, bool) {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid), true
	}
	return 0, false
}

// allocated is the bytes fi's file takes on disk (a flattened image is
// sparse: its zero pages are holes).
func allocated(fi fs.FileInfo) int64 {
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		return s.Blocks * 512
	}
	return fi.Size()
}
