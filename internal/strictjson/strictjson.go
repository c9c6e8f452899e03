// Package strictjson decodes JSON the way Warren reads what it did not
// write itself or must not misread (a guest's message, a tenant's policy,
// a snapshot's sections, a VMM's request): one value, no object field the
// destination lacks, nothing after it. encoding/json's Unmarshal drops
// unknown fields silently and a Decoder stops after the first value; a
// caller that forgets either reads something other than what was sent.
//
// May import: nothing of the module (internal).
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// ErrTrailing is the error of a value followed by more than white space.
var ErrTrailing = errors.New("trailing data after the JSON value")

// Unmarshal decodes the one JSON value in b into v: an object field v
// has no place for is an error, and so is anything but white space after
// the value (ErrTrailing).
func Unmarshal(b []byte, v any) error { return Decode(bytes.NewReader(b), v) }

// Decode is Unmarshal for the value read from r, which it reads to its
// end: the caller bounds r (io.LimitReader) when its writer is not
// trusted. An empty r gives io.EOF.
func Decode(r io.Reader, v any) error {
	d := json.NewDecoder(r)
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return ErrTrailing
	}
	return nil
}
