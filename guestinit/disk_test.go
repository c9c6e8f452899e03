//go:build linux

package guestinit

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestDataDiskFromCmdline(t *testing.T) {
	tests := []struct {
		cmdline string
		want    DataDisk
		err     bool
	}{
		{"console=ttyS0", DataDisk{true, DefaultDataMount, false}, false},
		{"warren.data=none", DataDisk{}, false},
		{"warren.data=none warren.data_ro=1", DataDisk{}, false},
		{"warren.data=/srv/disk", DataDisk{true, "/srv/disk", false}, false},
		{"warren.data=/srv warren.data=/var/lib/x", DataDisk{true, "/var/lib/x", false}, false},
		{"warren.data=", DataDisk{true, DefaultDataMount, false}, false},
		{"warren.data_ro=1", DataDisk{true, DefaultDataMount, true}, false},
		{"warren.data_ro", DataDisk{true, DefaultDataMount, true}, false},
		{"warren.data_ro=0", DataDisk{true, DefaultDataMount, false}, false},
		{`warren.data="/mnt/my disk" warren.data_ro=yes`, DataDisk{true, "/mnt/my disk", true}, false},
		{"warren.data=relative", DataDisk{true, DefaultDataMount, false}, true},
		{"warren.data=/mnt/../etc", DataDisk{true, DefaultDataMount, false}, true},
		{"warren.data=/mnt/data/", DataDisk{true, DefaultDataMount, false}, true},
		{"warren.data=/", DataDisk{true, DefaultDataMount, false}, true},
		{"warren.data=/proc/x warren.data_ro=1", DataDisk{true, DefaultDataMount, true}, true},
		{"warren.data=/dev", DataDisk{true, DefaultDataMount, false}, true},
		{"warren.data=/system", DataDisk{true, "/system", false}, false},
		{"warren.data=None", DataDisk{true, DefaultDataMount, false}, true},
	}
	for _, tt := range tests {
		got, err := DataDiskFromCmdline(ParseCmdline(tt.cmdline))
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("%q: got %+v, %v; want %+v, error %v", tt.cmdline, got, err, tt.want, tt.err)
		}
	}
}

func TestDataDiskDisabledOrAbsent(t *testing.T) {
	if err := (DataDisk{}).mount(); err != nil {
		t.Errorf("disabled: %v", err)
	}
	if _, err := os.Stat(DataDevice); !errors.Is(err, os.ErrNotExist) {
		t.Skipf("this machine has %s; not touching it", DataDevice)
	}
	target := filepath.Join(t.TempDir(), "data")
	if err := (DataDisk{Enabled: true, Target: target}).mount(); err != nil {
		t.Errorf("no disk attached: %v", err)
	}
	if _, err := os.Stat(target); err == nil {
		t.Error("mount point created without a disk")
	}
}
