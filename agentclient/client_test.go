package agentclient

import (
	"net/http"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

func TestAgentTimeHeader(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
	}{
		{"", 0}, {"1234", 1234}, {"-5", 0}, {"x", 0}, {"99999999999999999999", 0},
	} {
		h := http.Header{}
		if tc.v != "" {
			h.Set(agentwire.AgentTimeHeader, tc.v)
		}
		if got := AgentTime(h); got != tc.want {
			t.Errorf("%q: got %d want %d", tc.v, got, tc.want)
		}
	}
}
