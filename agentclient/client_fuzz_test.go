package agentclient

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// limitedWriter counts what the client passes on of an exec's output.
type limitedWriter struct{ n int }

func (w *limitedWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// FuzzClientReplies: a hostile agent answers each of the host client's
// calls with any bytes (status 200, the body the fuzzer's, a pid header
// for exec): health, stat, a listing, the services, an exec stream. The
// client returns an answer or an error within its reply timeout, never
// panics, and passes on no more of the exec's output than the agent
// sent.
func FuzzClientReplies(f *testing.F) {
	var body atomic.Pointer[[]byte]
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(agentwire.PidHeader, "42")
		w.WriteHeader(http.StatusOK)
		w.Write(*body.Load())
	}))
	sock := filepath.Join(f.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		f.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	f.Cleanup(srv.Close)
	c := NewDialLimits(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, Limits{Reply: 4 << 10, ReplyTimeout: 2 * time.Second})
	f.Cleanup(c.Close)

	frames := func(parts ...[]byte) []byte {
		var b bytes.Buffer
		for i := 0; i+1 < len(parts); i += 2 {
			agentwire.WriteFrame(&b, parts[i][0], parts[i+1])
		}
		return b.Bytes()
	}
	f.Add(byte(0), []byte(`{"ready":true,"uptime_ns":1}`))
	f.Add(byte(1), []byte(`{"path":"/x","size":3,"mode":420}`))
	f.Add(byte(2), []byte(`[{"path":"/a"},{"path":"/b"}]`))
	f.Add(byte(3), []byte(`[{"name":"s","running":true}]`))
	f.Add(byte(4), frames([]byte{agentwire.FrameStdout}, []byte("out"), []byte{agentwire.FrameStderr}, []byte("err"), []byte{agentwire.FrameExit}, []byte(`{"code":3}`)))
	f.Add(byte(4), frames([]byte{agentwire.FrameError}, []byte(`{"code":"not_found","message":"x"}`)))
	f.Add(byte(4), []byte{agentwire.FrameStdout, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, op byte, data []byte) {
		body.Store(&data)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		switch op % 5 {
		case 0:
			c.Health(ctx)
		case 1:
			c.Stat(ctx, "/x")
		case 2:
			c.List(ctx, "/")
		case 3:
			c.Services(ctx)
		case 4:
			var out, errOut limitedWriter
			c.ExecStatus(ctx, agentwire.ExecRequest{Argv: []string{"true"}}, &out, &errOut)
			if out.n+errOut.n > len(data) {
				t.Fatalf("%d bytes of output from a %d-byte stream", out.n+errOut.n, len(data))
			}
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("call %d took %s", op%5, took)
		}
	})
}
