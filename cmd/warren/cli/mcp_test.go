package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/client/clienttest"
	"github.com/warrenvm/warren/hostd/wire"
)

// TestMCPStdio: `warren mcp --host SOCKET` serves MCP on its stdin and
// stdout, against that daemon, and exits 0 when the client hangs up. (The
// tools themselves are mcpserver's tests'.)
func TestMCPStdio(t *testing.T) {
	stub := clienttest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(stub.Socket, "", "")
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := c.CreateTemplate(ctx, wire.TemplateRequest{Kernel: "vmlinux"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main([]string{"mcp", "--host", stub.Socket}, inR, outW, &errb)
		outW.Close()
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	call := func(name string, args map[string]any, out any) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %+v", name, err, res)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
	}
	var sb struct{ ID, Template string }
	call("create_sandbox", map[string]any{"template": tpl.ID}, &sb)
	if sb.ID == "" || sb.Template != tpl.ID {
		t.Fatalf("create_sandbox: %+v", sb)
	}
	var ex struct {
		ExitCode       int `json:"exit_code"`
		Stdout, Stderr string
	}
	// The stub's exec echoes its argv and exits with N for "exit N".
	call("exec", map[string]any{"sandbox": sb.ID, "argv": []string{"exit", "3"}}, &ex)
	if ex.ExitCode != 3 || ex.Stdout != "exit 3\n" || ex.Stderr != "err\n" {
		t.Errorf("exec: %+v", ex)
	}
	cs.Close()
	select {
	case rc := <-done:
		if rc != 0 {
			t.Errorf("warren mcp: exit %d: %s", rc, errb.String())
		}
	case <-ctx.Done():
		t.Fatal("warren mcp did not exit when its client hung up")
	}
}

func TestMCPBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"mcp", "--http", "no-port"},
		{"mcp", "extra"},
	} {
		rc, _, errOut := runCLI(append(args, "--host", "/nonexistent.sock")...)
		if rc == 0 || !strings.Contains(errOut, "warren mcp") {
			t.Errorf("%q: exit %d, %q", args, rc, errOut)
		}
	}
}
