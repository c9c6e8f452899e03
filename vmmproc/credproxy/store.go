package credproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Store gives the real value of a secret by name. Implementations must
// never put a secret's value in an error.
type Store interface {
	Secret(name string) (string, error)
}

// ErrNoSecret is wrapped by the errors of the stores here when a secret
// is not there.
var ErrNoSecret = errors.New("secret not in the store")

// maxSecretFile bounds a FileStore's file.
const maxSecretFile = 1 << 20

// FileStore reads secrets from a JSON object (name to value) in a host
// file, re-reading it on every lookup so that a rotated secret takes
// effect on the next request. The file must be a regular file readable
// by its owner only (no group or other permission bits).
type FileStore struct {
	Path string
}

// Secret returns the value of name from the file.
func (s FileStore) Secret(name string) (string, error) {
	m, err := s.load()
	if err != nil {
		return "", err
	}
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("credproxy: secret %q: %w (%s)", name, ErrNoSecret, s.Path)
	}
	return v, nil
}

// Check opens and parses the file, reporting any problem (permissions,
// syntax) without returning a value; hostd calls it at start-up.
func (s FileStore) Check() error {
	_, err := s.load()
	return err
}

func (s FileStore) load() (map[string]string, error) {
	f, err := os.Open(s.Path)
	if err != nil {
		return nil, fmt.Errorf("credproxy: secret file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat() // of the opened file, so no swap after the check
	if err != nil {
		return nil, fmt.Errorf("credproxy: secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("credproxy: secret file %s: not a regular file", s.Path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("credproxy: secret file %s: mode %#o is readable or writable by group or others; chmod 600 it", s.Path, perm)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("credproxy: secret file: %w", err)
	}
	if len(b) > maxSecretFile {
		return nil, fmt.Errorf("credproxy: secret file %s: larger than %d bytes", s.Path, maxSecretFile)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		// The decoder's message may quote the file's bytes: leave it out.
		return nil, fmt.Errorf("credproxy: secret file %s: not a JSON object of string values", s.Path)
	}
	return m, nil
}

// EnvStore reads secret NAME from the environment variable
// WARREN_SECRET_<NAME>, NAME upper-cased with every byte other than a
// letter or digit turned into '_'.
type EnvStore struct {
	// LookupEnv replaces os.LookupEnv (tests); nil uses os.LookupEnv.
	LookupEnv func(string) (string, bool)
}

// EnvVar returns the variable EnvStore reads for secret name.
func EnvVar(name string) string {
	var b strings.Builder
	b.WriteString("WARREN_SECRET_")
	for _, c := range []byte(strings.ToUpper(name)) {
		if c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Secret returns the value of name from the environment.
func (s EnvStore) Secret(name string) (string, error) {
	look := s.LookupEnv
	if look == nil {
		look = os.LookupEnv
	}
	v, ok := look(EnvVar(name))
	if !ok {
		return "", fmt.Errorf("credproxy: secret %q: %w (%s unset)", name, ErrNoSecret, EnvVar(name))
	}
	return v, nil
}

// MapStore is a Store held in memory (tests).
type MapStore map[string]string

// Secret returns m[name].
func (m MapStore) Secret(name string) (string, error) {
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("credproxy: secret %q: %w", name, ErrNoSecret)
	}
	return v, nil
}
