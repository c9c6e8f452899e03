package strictjson

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestUnmarshal: one value with known fields decodes; an unknown field,
// a second value, trailing garbage or nothing at all is refused.
func TestUnmarshal(t *testing.T) {
	type msg struct {
		A int    `json:"a"`
		B string `json:"b,omitempty"`
	}
	var m msg
	if err := Unmarshal([]byte(" {\"a\": 1, \"b\": \"x\"}\n\t "), &m); err != nil || m != (msg{1, "x"}) {
		t.Fatalf("%+v %v", m, err)
	}
	for _, c := range []struct {
		in   string
		want error
		text string
	}{
		{`{"a": 1, "c": 2}`, nil, "unknown field"},
		{`{"a": 1} {"a": 2}`, ErrTrailing, ""},
		{`{"a": 1}]`, ErrTrailing, ""},
		{`{"a": 1}x`, ErrTrailing, ""},
		{``, io.EOF, ""},
		{`{"a": "one"}`, nil, "cannot unmarshal"},
	} {
		err := Unmarshal([]byte(c.in), &msg{})
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%q: %v, want %v %q", c.in, err, c.want, c.text)
		}
	}
}
