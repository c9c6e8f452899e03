package agentclient

import (
	"bytes"
	"errors"
	"testing"

	"github.com/warrenvm/warren/agentwire"
)

// countingReader counts the bytes read from it.
type countingReader struct {
	r *bytes.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += k
	return k, err
}

// FuzzDecodeReply: whatever the guest sends, decodeReply reads at most
// limit+1 bytes of it, and fails with ErrReplyTooLarge exactly when it
// had to stop at the limit.
func FuzzDecodeReply(f *testing.F) {
	f.Add([]byte(`{"path":"/etc/hosts","size":12}`), uint16(64))
	f.Add([]byte(`[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]`), uint16(16))
	f.Add([]byte(`{"ok":true}`+"\n"), uint16(12))
	f.Add([]byte(`"`+string(bytes.Repeat([]byte("a"), 300))), uint16(100))
	f.Fuzz(func(t *testing.T, b []byte, lim uint16) {
		limit := int64(lim%4096) + 1
		cr := &countingReader{r: bytes.NewReader(b)}
		var fi agentwire.FileInfo
		err := decodeReply(cr, limit, &fi)
		if int64(cr.n) > limit+1 {
			t.Fatalf("read %d bytes with a limit of %d", cr.n, limit)
		}
		if errors.Is(err, ErrReplyTooLarge) != (int64(cr.n) > limit) {
			t.Fatalf("read %d of limit %d, err %v", cr.n, limit, err)
		}
	})
}
