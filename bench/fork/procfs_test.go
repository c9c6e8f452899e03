package main

import (
	"strings"
	"testing"
)

const meminfoSample = `MemTotal:       16331224 kB
MemFree:         9723660 kB
MemAvailable:   13650000 kB
Buffers:          200804 kB
Shmem:            512000 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
`

const smapsRollupSample = `55d0c0a00000-7ffd5b5fe000 ---p 00000000 00:00 0                          [rollup]
Rss:              136220 kB
Pss:               70110 kB
Pss_Dirty:          4000 kB
Pss_Anon:           3000 kB
Pss_File:           1110 kB
Pss_Shmem:         66000 kB
Shared_Clean:     130000 kB
Shared_Dirty:          0 kB
Private_Clean:      2200 kB
Private_Dirty:      4020 kB
Referenced:       136220 kB
Anonymous:          3000 kB
Swap:                  0 kB
`

func TestParseMeminfo(t *testing.T) {
	m, err := parseMeminfo(strings.NewReader(meminfoSample))
	if err != nil {
		t.Fatal(err)
	}
	if m.Total != 16331224*1024 || m.Available != 13650000*1024 {
		t.Errorf("got %+v", m)
	}
	if _, err := parseMeminfo(strings.NewReader("MemTotal: 1 kB\n")); err == nil {
		t.Error("no MemAvailable: no error")
	}
}

func TestParseSmapsRollup(t *testing.T) {
	m, err := parseSmapsRollup(strings.NewReader(smapsRollupSample))
	if err != nil {
		t.Fatal(err)
	}
	want := procMem{Rss: 136220 * 1024, Pss: 70110 * 1024, Private: (2200 + 4020) * 1024}
	if m != want {
		t.Errorf("got %+v, want %+v", m, want)
	}
	if _, err := parseSmapsRollup(strings.NewReader("Rss: 4 kB\n")); err == nil {
		t.Error("no Pss: no error")
	}
}

func TestKBFieldsSkipsOtherLines(t *testing.T) {
	f, err := kBFields(strings.NewReader("garbage\nA: x kB\nB: 1 MB\nC: 3\nD:  2 kB\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 2 || f["C"] != 3 || f["D"] != 2048 {
		t.Errorf("got %v", f)
	}
}

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("128, 1024,4096")
	if err != nil || len(got) != 3 || got[0] != 128 || got[1] != 1024 || got[2] != 4096 {
		t.Errorf("got %v, %v", got, err)
	}
	if got, err := parseSizes(" "); err != nil || got != nil {
		t.Errorf("empty: %v, %v; want none", got, err)
	}
	for _, bad := range []string{",", "0", "12,x", "-5"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
