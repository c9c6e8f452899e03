package client_test

import (
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/client"
)

func TestEnvConfig(t *testing.T) {
	for _, k := range []string{"WARREN_HOST", "WARREN_TENANT", "WARREN_TOKEN", "WARREN_CA", "WARREN_CLIENT_CERT", "WARREN_CLIENT_KEY"} {
		t.Setenv(k, "")
	}
	if got := client.EnvConfig(); got != (client.Config{Host: client.DefaultSocket}) {
		t.Errorf("an empty environment: %+v, want the default socket only", got)
	}
	t.Setenv("WARREN_HOST", "http://127.0.0.1:1")
	t.Setenv("WARREN_TENANT", "acme")
	t.Setenv("WARREN_TOKEN", "tok")
	t.Setenv("WARREN_CA", "/nonexistent/ca.pem")
	t.Setenv("WARREN_CLIENT_CERT", "c.pem")
	t.Setenv("WARREN_CLIENT_KEY", "k.pem")
	cfg := client.EnvConfig()
	want := client.Config{Host: "http://127.0.0.1:1", Tenant: "acme", Token: "tok",
		TLS: client.TLS{CAFile: "/nonexistent/ca.pem", CertFile: "c.pem", KeyFile: "k.pem"}}
	if cfg != want {
		t.Fatalf("EnvConfig() = %+v, want %+v", cfg, want)
	}

	// The environment's TLS files are dropped for a daemon that is not
	// https; given explicitly they are an error there.
	if c, err := cfg.Connect(false); err != nil || c.Tenant() != "acme" {
		t.Errorf("http daemon, TLS from the environment: %v", err)
	}
	if _, err := cfg.Connect(true); err == nil || !strings.Contains(err.Error(), "needs an https:// daemon address") {
		t.Errorf("http daemon, TLS given: %v, want refused", err)
	}
	// For an https daemon they apply either way.
	cfg.Host = "https://127.0.0.1:1"
	for _, explicit := range []bool{false, true} {
		if _, err := cfg.Connect(explicit); err == nil || !strings.Contains(err.Error(), "CA file") {
			t.Errorf("https daemon (explicit %v): %v, want the CA file read", explicit, err)
		}
	}
}
