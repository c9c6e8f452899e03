package agentclient

import "testing"

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Target
		wantErr bool
	}{
		{in: "/tmp/vm.sock:/etc/hosts", want: Target{VM: "/tmp/vm.sock", Path: "/etc/hosts"}},
		{in: "vm.sock:/a:/b", want: Target{VM: "vm.sock", Path: "/a:/b"}},
		{in: "./local/file", want: Target{Path: "./local/file"}},
		{in: "-", want: Target{Path: "-"}},
		{in: "c:relative", want: Target{Path: "c:relative"}},
		{in: ":/etc/hosts", wantErr: true},
		{in: "", wantErr: true},
	} {
		got, err := ParseTarget(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseTarget(%q) error %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseTarget(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if !tc.wantErr && got.String() != tc.in {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
}
