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
