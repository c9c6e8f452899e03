//go:build linux

package guestinit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// devLinks are the /dev symlinks that udev would make and programs expect
// (wget -O - writes to /dev/stdout, shells use /dev/fd/N). devtmpfs has
// none of them.
var devLinks = [][2]string{
	{"/proc/self/fd", "/dev/fd"},
	{"/proc/self/fd/0", "/dev/stdin"},
	{"/proc/self/fd/1", "/dev/stdout"},
	{"/proc/self/fd/2", "/dev/stderr"},
}

// makeDevLinks creates devLinks, leaving any that already exist.
func makeDevLinks() error {
	var errs []error
	for _, l := range devLinks {
		if err := os.Symlink(l[0], l[1]); err != nil && !errors.Is(err, fs.ErrExist) {
			errs = append(errs, fmt.Errorf("symlink %s: %w", l[1], err))
		}
	}
	return errors.Join(errs...)
}
