package vmmproc

import "testing"

func TestParseMAC(t *testing.T) {
	m, err := ParseMAC("")
	if err != nil || len(m) != 6 || m[0]&1 != 0 || m[0]&2 == 0 {
		t.Errorf("random MAC %v, %v", m, err)
	}
	if m, err := ParseMAC("52:54:00:12:34:56"); err != nil || m.String() != "52:54:00:12:34:56" {
		t.Errorf("parsed %v, %v", m, err)
	}
	for _, bad := range []string{"01:00:5e:00:00:01", "zz", "52:54:00:12:34"} {
		if _, err := ParseMAC(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
