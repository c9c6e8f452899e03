package mcpserver

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warrenvm/warren/hostd/client"
)

// The end-to-end tests drive a real warren-hostd (sdk/test.sh starts one
// and sets the environment): $WARREN_HOST, $WARREN_TENANT and $WARREN_TOKEN
// say how to reach it, $WARREN_TEST_TEMPLATE is a ready template's id and
// $WARREN_BIN the warren command.

// e2eTemplate returns $WARREN_TEST_TEMPLATE, or skips the test.
func e2eTemplate(t *testing.T) string {
	t.Helper()
	tpl := os.Getenv("WARREN_TEST_TEMPLATE")
	if tpl == "" {
		t.Skip("WARREN_TEST_TEMPLATE is not set: no warren-hostd to test against (sdk/test.sh mcp sets it up)")
	}
	return tpl
}

// TestE2EInMemory runs the scenario of TestInMemory through the server in
// this process, against the daemon of the environment.
func TestE2EInMemory(t *testing.T) {
	tpl := e2eTemplate(t)
	c, err := client.EnvConfig().Connect(false)
	if err != nil {
		t.Fatal(err)
	}
	drive(t, inMemory(t, c), tpl)
}

// TestE2EStdio runs the scenario through `$WARREN_BIN mcp`, a child
// process spoken to over its stdin and stdout, as an MCP client such as
// Claude Desktop runs it.
func TestE2EStdio(t *testing.T) {
	tpl := e2eTemplate(t)
	bin := os.Getenv("WARREN_BIN")
	if bin == "" {
		t.Skip("WARREN_BIN is not set: no warren command to run (sdk/test.sh mcp sets it)")
	}
	cmd := exec.Command(bin, "mcp")
	cmd.Stderr = os.Stderr
	drive(t, newSession(t, &mcp.CommandTransport{Command: cmd}), tpl)
}

// TestE2EHTTPCommand runs `$WARREN_BIN mcp --http 127.0.0.1:0` with its
// token in $WARREN_MCP_TOKEN: a request without the token is refused, a
// client with it lists the daemon's templates.
func TestE2EHTTPCommand(t *testing.T) {
	tpl := e2eTemplate(t)
	bin := os.Getenv("WARREN_BIN")
	if bin == "" {
		t.Skip("WARREN_BIN is not set: no warren command to run (sdk/test.sh mcp sets it)")
	}
	const token = "e2e-token"
	cmd := exec.Command(bin, "mcp", "--http", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "WARREN_MCP_TOKEN="+token)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("warren mcp --http: %v", err)
		}
	}()
	// Its first line says where it serves.
	sc := bufio.NewScanner(stderr)
	var url string
	for sc.Scan() {
		t.Log(sc.Text())
		if _, u, ok := strings.Cut(sc.Text(), "serving "); ok {
			url = u
			break
		}
	}
	go io.Copy(io.Discard, stderr)
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, Path) {
		t.Fatalf("warren mcp --http serves %q", url)
	}
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a request without the token: %s, want 401", resp.Status)
	}
	s := newSession(t, &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}})
	var tpls Templates
	s.call("list_templates", nil, &tpls)
	found := false
	for _, x := range tpls.Templates {
		found = found || x.ID == tpl
	}
	if !found {
		t.Errorf("list_templates over HTTP: %+v, want %s", tpls, tpl)
	}
	s.cs.Close() // before the server's shutdown, which waits for open streams
}
