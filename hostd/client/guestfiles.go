package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"

	"github.com/warrenvm/warren/hostd/wire"
)

// The file API beyond ReadFile and WriteFile: listing, stat, mkdir,
// remove, rename and watching a sandbox's guest files. Paths are the
// guest's, absolute.

// filesPath is the daemon's path of sandbox id's file operation op ("" for
// /files itself) with query q.
func filesPath(id, op string, q url.Values) string {
	p := "/files"
	if op != "" {
		p += "/" + op
	}
	return sbPath(id, p+"?"+q.Encode())
}

// ListFiles returns the entries under the guest directory path, depth
// levels down (1, or 0: its own entries; at most agentwire.MaxListDepth),
// each with its Path, parents before their children.
func (c *Client) ListFiles(ctx context.Context, id, path string, depth int) ([]wire.FileInfo, error) {
	q := url.Values{"path": {path}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	return listFor[wire.FileInfo](ctx, c, filesPath(id, "list", q))
}

// StatFile returns the guest file path's FileInfo (a symbolic link's own:
// Link is its target).
func (c *Client) StatFile(ctx context.Context, id, path string) (*wire.FileInfo, error) {
	return callFor[wire.FileInfo](ctx, c, http.MethodGet, filesPath(id, "stat", url.Values{"path": {path}}), nil)
}

// Mkdir creates the guest directory path with mode's permission bits (0:
// 0755), and its missing parents when parents is set (an existing
// directory is then no error).
func (c *Client) Mkdir(ctx context.Context, id, path string, mode fs.FileMode, parents bool) (*wire.FileInfo, error) {
	if mode.Perm() == 0 {
		mode = 0o755
	}
	q := url.Values{"path": {path}, "mode": {strconv.FormatUint(uint64(mode.Perm()), 8)}}
	if parents {
		q.Set("parents", "1")
	}
	return callFor[wire.FileInfo](ctx, c, http.MethodPost, filesPath(id, "mkdir", q), nil)
}

// RemoveFile removes the guest file or empty directory path, or, when
// recursive is set, a directory and everything under it.
func (c *Client) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	return c.call(ctx, http.MethodDelete, filesPath(id, "", q), nil, nil)
}

// RenameFile renames the guest file from to to (rename(2): an existing to
// is replaced) and returns to's FileInfo.
func (c *Client) RenameFile(ctx context.Context, id, from, to string) (*wire.FileInfo, error) {
	return callFor[wire.FileInfo](ctx, c, http.MethodPost, sbPath(id, "/files/rename"), wire.RenameRequest{From: from, To: to})
}

// WatchFiles watches the guest directory path (and, when recursive is
// set, the directories under it, new ones included) and calls fn with
// each change until fn returns false, ctx ends or the stream ends. The
// first event is Op "ready": the watches are in place. It returns nil when
// fn said stop, ctx's error when ctx ended, and an error otherwise.
func (c *Client) WatchFiles(ctx context.Context, id, path string, recursive bool, fn func(wire.WatchEvent) bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	resp, err := c.do(ctx, http.MethodGet, filesPath(id, "watch", q), nil, "application/x-ndjson")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		var l struct {
			wire.WatchEvent
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("watch %s in %s: bad event: %w", path, id, err)
		}
		if l.Error != "" {
			return &Error{Status: http.StatusBadGateway, Message: l.Error}
		}
		if !fn(l.WatchEvent) {
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("watch %s in %s: %w", path, id, err)
	}
	return fmt.Errorf("watch %s in %s: the stream ended", path, id)
}
