// Package imageconfig is the contract between the host's image builder
// (package image) and the guest's PID 1 (package guestinit) about a root
// file system made from an OCI or Docker image: the builder writes the
// image's configuration as JSON at Path inside the root file system it
// makes, and PID 1 reads it after it has moved into that root, so that the
// agent starts processes the way the image asks (environment, working
// directory, user) and knows the image's own start command.
//
// The file is written by the host, but it lives on a disk the guest can
// write to, so the guest treats it as untrusted input like any other
// file: Parse bounds its size and checks every field.
package imageconfig

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"

	"github.com/warrenvm/warren/internal/strictjson"
)

// Path is where the image builder puts the configuration inside the root
// file system (the builder drops whatever an image brings under /.warren:
// that directory is Warren's).
const Path = "/.warren/image.json"

// Version is the format version this package writes and reads.
const Version = 1

// Bounds Parse enforces.
const (
	// MaxBytes bounds the file.
	MaxBytes = 1 << 20
	// MaxEntries bounds Env, Entrypoint and Cmd (each).
	MaxEntries = 4096
	// MaxString bounds every string.
	MaxString = 64 << 10
)

// Config is the part of an image's configuration (the OCI image config's
// "config" object) that a Warren guest honours, plus where it came from.
type Config struct {
	// Version is the format version (Version).
	Version int `json:"version"`
	// Ref is the reference the image was pulled by, for people.
	Ref string `json:"ref,omitempty"`
	// Digest is the image's config digest ("sha256:<hex>"), which names
	// the base the root file system was made from.
	Digest string `json:"digest,omitempty"`
	// Env is the image's environment, KEY=VALUE entries: the base
	// environment of every process the agent starts.
	Env []string `json:"env,omitempty"`
	// WorkingDir is the default working directory of those processes
	// (absolute; "" means "/").
	WorkingDir string `json:"working_dir,omitempty"`
	// User is the default user: "name", "uid", "name:group", "uid:gid"
	// (resolved in the guest against the image's /etc/passwd and
	// /etc/group); "" means root.
	User string `json:"user,omitempty"`
	// Entrypoint and Cmd are the image's start command (Entrypoint
	// followed by Cmd, as a container runtime runs it). A template may
	// run it, supervised, before its snapshot is taken.
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Argv is the image's start command: Entrypoint followed by Cmd; nil when
// the image has neither.
func (c Config) Argv() []string {
	if len(c.Entrypoint)+len(c.Cmd) == 0 {
		return nil
	}
	return append(append([]string(nil), c.Entrypoint...), c.Cmd...)
}

// Marshal returns c as the file's bytes, after checking it as Parse does.
func (c Config) Marshal() ([]byte, error) {
	c.Version = Version
	if err := c.Check(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("imageconfig: %d bytes, more than %d", len(b), MaxBytes)
	}
	return b, nil
}

// Parse reads the file's bytes: at most MaxBytes of JSON with no unknown
// fields, of version Version, with every field checked (Check).
func Parse(b []byte) (Config, error) {
	var c Config
	if len(b) > MaxBytes {
		return c, fmt.Errorf("imageconfig: %d bytes, more than %d", len(b), MaxBytes)
	}
	if err := strictjson.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("imageconfig: %w", err)
	}
	if c.Version != Version {
		return Config{}, fmt.Errorf("imageconfig: version %d, this guest reads version %d", c.Version, Version)
	}
	if err := c.Check(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Check validates the fields: bounded counts and lengths, no NUL bytes,
// Env entries of the form KEY=VALUE with a non-empty KEY, and an absolute,
// clean WorkingDir.
func (c Config) Check() error {
	for _, l := range []struct {
		name string
		v    []string
	}{{"env", c.Env}, {"entrypoint", c.Entrypoint}, {"cmd", c.Cmd}} {
		if len(l.v) > MaxEntries {
			return fmt.Errorf("imageconfig: %s has %d entries, more than %d", l.name, len(l.v), MaxEntries)
		}
		for _, s := range l.v {
			if err := checkString(l.name, s); err != nil {
				return err
			}
		}
	}
	for _, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("imageconfig: env entry %q is not KEY=VALUE", e)
		}
	}
	for _, f := range []struct{ name, v string }{{"ref", c.Ref}, {"digest", c.Digest}, {"working_dir", c.WorkingDir}, {"user", c.User}} {
		if err := checkString(f.name, f.v); err != nil {
			return err
		}
	}
	if c.WorkingDir != "" && (!path.IsAbs(c.WorkingDir) || path.Clean(c.WorkingDir) != c.WorkingDir) {
		return fmt.Errorf("imageconfig: working_dir %q is not a clean absolute path", c.WorkingDir)
	}
	return nil
}

func checkString(field, s string) error {
	if len(s) > MaxString {
		return fmt.Errorf("imageconfig: a %s string of %d bytes, more than %d", field, len(s), MaxString)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("imageconfig: a %s string holds a NUL byte", field)
	}
	return nil
}
