package client

import (
	"os"
	"strings"
)

// Config is how a client reaches a daemon: its address (New's host), the
// tenant to act as, the bearer token of a TCP daemon and the TLS files of
// an https:// one.
type Config struct {
	Host, Tenant, Token string
	TLS                 TLS
}

// EnvConfig returns the settings of the environment, the defaults of the
// warren command's daemon flags: $WARREN_HOST (else DefaultSocket),
// $WARREN_TENANT, $WARREN_TOKEN, and $WARREN_CA, $WARREN_CLIENT_CERT and
// $WARREN_CLIENT_KEY (TLS).
func EnvConfig() Config {
	host := os.Getenv("WARREN_HOST")
	if host == "" {
		host = DefaultSocket
	}
	return Config{Host: host, Tenant: os.Getenv("WARREN_TENANT"), Token: os.Getenv("WARREN_TOKEN"), TLS: TLS{
		CAFile: os.Getenv("WARREN_CA"), CertFile: os.Getenv("WARREN_CLIENT_CERT"), KeyFile: os.Getenv("WARREN_CLIENT_KEY"),
	}}
}

// Connect returns a client of cfg's daemon (NewTLS). TLS files that come
// from the environment apply only to an https:// daemon and are dropped
// for another; explicitTLS says the caller gave cfg.TLS (on the command
// line), when for another daemon they are NewTLS's error.
func (cfg Config) Connect(explicitTLS bool) (*Client, error) {
	t := cfg.TLS
	if !explicitTLS && !strings.HasPrefix(cfg.Host, "https://") {
		t = TLS{}
	}
	return NewTLS(cfg.Host, cfg.Tenant, cfg.Token, t)
}
