package guestinit

import (
	"errors"
	"testing"
	"time"
)

func TestParseUptime(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"61.42 3.10\n", 61*time.Second + 420*time.Millisecond, false},
		{"0.05 0.00\n", 50 * time.Millisecond, false},
		{"12345.67 1.00", 12345*time.Second + 670*time.Millisecond, false},
		{"7", 7 * time.Second, false},
		{"7.5", 7*time.Second + 500*time.Millisecond, false},
		{"", 0, true},
		{"\n", 0, true},
		{"abc 1.0", 0, true},
		{".5 1", 0, true},
		{"-1.00 0", 0, true},
		{"1.-5 0", 0, true},
		{"1.2.3 0", 0, true},
		{"1.1234567890", 0, true},
		{"99999999999.00 0", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseUptime(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("ParseUptime(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestReadyLine(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{61*time.Second + 420*time.Millisecond, "warren-init: ready uptime=61.42\n"},
		{0, "warren-init: ready uptime=0.00\n"},
		{-time.Second, "warren-init: ready uptime=0.00\n"},
		{5*time.Millisecond + 999*time.Microsecond, "warren-init: ready uptime=0.00\n"},
		{3*time.Second + 70*time.Millisecond, "warren-init: ready uptime=3.07\n"},
		{100*time.Second + 999*time.Millisecond, "warren-init: ready uptime=100.99\n"},
	}
	for _, tt := range tests {
		if got := ReadyLine(tt.in); got != tt.want {
			t.Errorf("ReadyLine(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// The ready line round-trips the kernel's two-decimal uptime exactly.
func TestReadyLineFromUptime(t *testing.T) {
	for _, s := range []string{"61.42 1.00", "0.01 0.00", "1000000.99 5.00"} {
		d, err := ParseUptime(s)
		if err != nil {
			t.Fatal(err)
		}
		want := "warren-init: ready uptime=" + s[:len(s)-5] + "\n"
		if got := ReadyLine(d); got != want {
			t.Errorf("%q: got %q, want %q", s, got, want)
		}
	}
}

func TestErrorLine(t *testing.T) {
	got := ErrorLine(errors.New("mount /proc: no\nsuch"))
	if want := "warren-init: error: mount /proc: no such\n"; got != want {
		t.Errorf("ErrorLine = %q, want %q", got, want)
	}
}

func FuzzParseUptime(f *testing.F) {
	for _, s := range []string{"61.42 3.10\n", "0", ".", "1.", "4294967295.999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseUptime(s)
		if err == nil && d < 0 {
			t.Fatalf("negative uptime %v from %q", d, s)
		}
		if err == nil {
			_ = ReadyLine(d)
		}
	})
}
