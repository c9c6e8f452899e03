package client

// What a client reads on its side for a request: policy files, labels
// and secret values.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// ReadPolicy reads an egress policy file for Create or SetEgress: only
// checked to be JSON here (the daemon checks the policy).
func ReadPolicy(path string) (json.RawMessage, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%s: not JSON", path)
	}
	return b, nil
}

// ParseLabels reads KEY=VALUE labels (a later KEY wins) into a sandbox
// request's Labels: nil for none, an error for one without = or with an
// empty KEY.
func ParseLabels(kvs []string) (map[string]string, error) {
	var labels map[string]string
	for _, l := range kvs {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not KEY=VALUE", l)
		}
		if labels == nil {
			labels = map[string]string{}
		}
		labels[k] = v
	}
	return labels, nil
}

// MaxSecretRead bounds what ReadSecret reads from a stream.
const MaxSecretRead = 1 << 20

// ReadSecret reads a secret's value for SetSecret: the file src, or
// stdin (at most MaxSecretRead bytes) when src is "" or "-" (nil stdin:
// empty); one trailing newline (\n or \r\n) is dropped. A value never
// comes from a command line, where the process list and shell history
// would show it.
func ReadSecret(src string, stdin io.Reader) ([]byte, error) {
	var v []byte
	var err error
	if src != "" && src != "-" {
		v, err = os.ReadFile(src)
	} else if stdin != nil {
		v, err = io.ReadAll(io.LimitReader(stdin, MaxSecretRead))
	}
	if err != nil {
		return nil, err
	}
	if t, ok := bytes.CutSuffix(v, []byte("\n")); ok {
		v = bytes.TrimSuffix(t, []byte("\r"))
	}
	return v, nil
}
