package client

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"github.com/warrenvm/warren/agentclient"
)

// CopyTarget is one side of a copy through the daemon (`warren cp`): a
// file in a sandbox's guest (Sandbox set: an id or a name, Resolve's
// ref) or a host path ("-": standard input or output).
type CopyTarget struct {
	Sandbox string
	// Path is the guest path (absolute) or the host path.
	Path string
}

// ParseCopyTarget reads SANDBOX:/guest/path (split at the first colon
// followed by a slash) or, without such a colon, a host path.
func ParseCopyTarget(s string) CopyTarget {
	if i := strings.Index(s, ":/"); i > 0 {
		return CopyTarget{Sandbox: s[:i], Path: s[i+1:]}
	}
	return CopyTarget{Path: s}
}

// Copy copies between the host and a sandbox's guest: src and dst are
// read by ParseCopyTarget, and exactly one of them must name a sandbox.
// See CopyIn and CopyOut.
func (c *Client) Copy(ctx context.Context, src, dst string, stdin io.Reader, stdout io.Writer) error {
	s, d := ParseCopyTarget(src), ParseCopyTarget(dst)
	if (s.Sandbox == "") == (d.Sandbox == "") {
		return fmt.Errorf("exactly one of %s and %s must be SANDBOX:/guest/path", src, dst)
	}
	if d.Sandbox != "" {
		return c.CopyIn(ctx, s.Path, d, stdin)
	}
	return c.CopyOut(ctx, s, d.Path, stdout)
}

// CopyIn uploads the host file hostPath (or stdin for "-"; nil reads as
// empty) into the sandbox dst names, with its permission bits
// (agentclient.OpenCopySource); to a guest path ending in / it keeps the
// base name.
func (c *Client) CopyIn(ctx context.Context, hostPath string, dst CopyTarget, stdin io.Reader) error {
	id, err := c.Resolve(ctx, dst.Sandbox)
	if err != nil {
		return err
	}
	r, mode, done, err := agentclient.OpenCopySource(hostPath, stdin)
	if err != nil {
		return err
	}
	defer done()
	if r == nil {
		r = strings.NewReader("")
	}
	p := dst.Path
	if strings.HasSuffix(p, "/") && hostPath != "-" {
		p = path.Join(p, filepath.Base(hostPath))
	}
	_, err = c.WriteFile(ctx, id, p, r, mode)
	return err
}

// CopyOut downloads the guest file src names to the host file hostPath
// (or stdout for "-"), as agentclient.WriteHostCopy writes it: renamed
// into place when complete, with the guest file's permission bits, and
// into a host directory under its base name.
func (c *Client) CopyOut(ctx context.Context, src CopyTarget, hostPath string, stdout io.Writer) error {
	id, err := c.Resolve(ctx, src.Sandbox)
	if err != nil {
		return err
	}
	return agentclient.WriteHostCopy(hostPath, src.Path, stdout, func(w io.Writer) (fs.FileMode, error) {
		return c.ReadFile(ctx, id, src.Path, w)
	})
}
