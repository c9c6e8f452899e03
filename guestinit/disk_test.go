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
		{"console=ttyS0", DataDisk{true, DefaultDataMount, false, DataDevice}, false},
		{"warren.data=none", DataDisk{}, false},
		{"warren.data=none warren.data_ro=1", DataDisk{}, false},
		{"warren.data=/srv/disk", DataDisk{true, "/srv/disk", false, DataDevice}, false},
		{"warren.data=/srv warren.data=/var/lib/x", DataDisk{true, "/var/lib/x", false, DataDevice}, false},
		{"warren.data=", DataDisk{true, DefaultDataMount, false, DataDevice}, false},
		{"warren.data_ro=1", DataDisk{true, DefaultDataMount, true, DataDevice}, false},
		{"warren.data_ro", DataDisk{true, DefaultDataMount, true, DataDevice}, false},
		{"warren.data_ro=0", DataDisk{true, DefaultDataMount, false, DataDevice}, false},
		{`warren.data="/mnt/my disk" warren.data_ro=yes`, DataDisk{true, "/mnt/my disk", true, DataDevice}, false},
		{"warren.data=relative", DataDisk{true, DefaultDataMount, false, DataDevice}, true},
		{"warren.data=/mnt/../etc", DataDisk{true, DefaultDataMount, false, DataDevice}, true},
		{"warren.data=/mnt/data/", DataDisk{true, DefaultDataMount, false, DataDevice}, true},
		{"warren.data=/", DataDisk{true, DefaultDataMount, false, DataDevice}, true},
		{"warren.data=/proc/x warren.data_ro=1", DataDisk{true, DefaultDataMount, true, DataDevice}, true},
		{"warren.data=/dev", DataDisk{true, DefaultDataMount, false, DataDevice}, true},
		{"warren.data=/system", DataDisk{true, "/system", false, DataDevice}, false},
		{"warren.data=None", DataDisk{true, DefaultDataMount, false, DataDevice}, true},
		// Never the root disk.
		{"warren.root=/dev/vda", DataDisk{true, DefaultDataMount, false, DataDeviceAfterRoot}, false},
		{"warren.root=/dev/vda warren.data=/srv", DataDisk{true, "/srv", false, DataDeviceAfterRoot}, false},
		{"warren.root=/dev/vdb", DataDisk{true, DefaultDataMount, false, DataDevice}, false},
		{"warren.root=vda", DataDisk{true, DefaultDataMount, false, DataDeviceAfterRoot}, false},
		{"warren.root=/dev/vda warren.data=none", DataDisk{}, false},
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
	if err := (DataDisk{Enabled: true, Target: target, Device: DataDevice}).mount(); err != nil {
		t.Errorf("no disk attached: %v", err)
	}
	if _, err := os.Stat(target); err == nil {
		t.Error("mount point created without a disk")
	}
}
