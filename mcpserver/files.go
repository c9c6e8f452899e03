package mcpserver

// The tools of a sandbox's files: read_file, write_file and list_files.
// Paths are the guest's, absolute.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warrenvm/warren/agentwire"
)

// Encodings of file content.
const (
	encText   = "text"
	encBase64 = "base64"
)

// ReadInput is read_file's input.
type ReadInput struct {
	SandboxRef
	Path     string `json:"path" jsonschema:"the file's absolute path in the sandbox"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default: the file must be UTF-8) or base64 (any bytes)"`
}

// ReadOutput is read_file's output.
type ReadOutput struct {
	Path     string `json:"path"`
	Content  string `json:"content" jsonschema:"the file's content, in encoding"`
	Encoding string `json:"encoding" jsonschema:"text or base64"`
	Size     int    `json:"size" jsonschema:"the file's size in bytes"`
	Mode     string `json:"mode" jsonschema:"its permission bits, octal"`
}

// WriteInput is write_file's input.
type WriteInput struct {
	SandboxRef
	Path     string `json:"path" jsonschema:"the file's absolute path in the sandbox (its directory must exist); an existing file is replaced"`
	Content  string `json:"content" jsonschema:"the content, in encoding"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"permission bits, octal (default 644; 755 for a script)"`
}

// WriteOutput is write_file's output.
type WriteOutput struct {
	Path string `json:"path"`
	Size int64  `json:"size" jsonschema:"the bytes written"`
	Mode string `json:"mode" jsonschema:"its permission bits, octal"`
}

// ListInput is list_files' input.
type ListInput struct {
	SandboxRef
	Path  string `json:"path" jsonschema:"the directory's absolute path in the sandbox"`
	Depth int    `json:"depth,omitempty" jsonschema:"how many levels down to list (default 1: the directory's own entries)"`
}

// File is an entry of list_files.
type File struct {
	Path    string    `json:"path" jsonschema:"its absolute path"`
	Type    string    `json:"type" jsonschema:"file, dir, symlink or other"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode" jsonschema:"its type and permission bits, as ls shows them"`
	Link    string    `json:"link,omitempty" jsonschema:"a symlink's target"`
	ModTime time.Time `json:"mod_time"`
}

// ListOutput is list_files' output.
type ListOutput struct {
	Files     []File `json:"files" jsonschema:"parents before their children"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"there were more entries than returned: list a deeper directory or use a smaller depth"`
}

func (t *tools) addFileTools(s *mcp.Server) {
	encodings := func(p map[string]*jsonschema.Schema) { enum(p["encoding"], encText, encBase64) }
	add(s, &mcp.Tool{Name: "read_file", Annotations: readOnly,
		Description: fmt.Sprintf("Read a file in a sandbox (at most %d KiB). A text file comes as text; a binary one needs encoding base64.", t.lim.ReadFile>>10)},
		encodings, onSandbox(t, t.readFile))
	add(s, &mcp.Tool{Name: "write_file", Annotations: mutating,
		Description: "Write (create or replace) a file in a sandbox, from text or base64 content."},
		encodings, onSandbox(t, t.writeFile))
	add(s, &mcp.Tool{Name: "list_files", Annotations: readOnly,
		Description: fmt.Sprintf("List a directory in a sandbox, depth levels down (at most %d entries).", t.lim.ListEntries)},
		func(p map[string]*jsonschema.Schema) { bounds(p["depth"], 1, agentwire.MaxListDepth) }, onSandbox(t, t.listFiles))
}

// checkPath checks a tool's guest path argument.
func checkPath(p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("path must be absolute (start with /), not %q", p)
	}
	return nil
}

// errTooLarge stops a read past the limit.
var errTooLarge = errors.New("file too large")

// capped is a buffer that fails a write past max bytes. (Not an embedded
// bytes.Buffer: io.Copy would use its ReadFrom, past the limit.)
type capped struct {
	buf bytes.Buffer
	max int64
}

func (c *capped) Write(p []byte) (int, error) {
	if int64(c.buf.Len()+len(p)) > c.max {
		return 0, errTooLarge
	}
	return c.buf.Write(p)
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, id string, in ReadInput) (ReadOutput, error) {
	if err := checkPath(in.Path); err != nil {
		return ReadOutput{}, err
	}
	enc := in.Encoding
	if enc == "" {
		enc = encText
	}
	if enc != encText && enc != encBase64 {
		return ReadOutput{}, fmt.Errorf("encoding must be text or base64, not %q", enc)
	}
	buf := &capped{max: t.lim.ReadFile}
	mode, err := t.d.ReadFile(ctx, id, in.Path, buf)
	if errors.Is(err, errTooLarge) {
		return ReadOutput{}, fmt.Errorf("%s is larger than %d KiB, more than read_file returns: read a part of it with exec (head -c, tail -c, sed -n '1,100p', grep)", in.Path, t.lim.ReadFile>>10)
	}
	if err != nil {
		return ReadOutput{}, err
	}
	out := ReadOutput{Path: in.Path, Encoding: enc, Size: buf.buf.Len(), Mode: strconv.FormatUint(uint64(mode.Perm()), 8)}
	if enc == encBase64 {
		out.Content = base64.StdEncoding.EncodeToString(buf.buf.Bytes())
		return out, nil
	}
	if !utf8.Valid(buf.buf.Bytes()) {
		return ReadOutput{}, fmt.Errorf("%s is not UTF-8 text: read it with encoding base64", in.Path)
	}
	out.Content = buf.buf.String()
	return out, nil
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, id string, in WriteInput) (WriteOutput, error) {
	if err := checkPath(in.Path); err != nil {
		return WriteOutput{}, err
	}
	var data []byte
	switch in.Encoding {
	case "", encText:
		data = []byte(in.Content)
	case encBase64:
		var err error
		if data, err = base64.StdEncoding.DecodeString(strings.TrimSpace(in.Content)); err != nil {
			return WriteOutput{}, fmt.Errorf("content is not base64: %v", err)
		}
	default:
		return WriteOutput{}, fmt.Errorf("encoding must be text or base64, not %q", in.Encoding)
	}
	if len(data) > t.lim.WriteFile {
		return WriteOutput{}, fmt.Errorf("content is larger than %d MiB", t.lim.WriteFile>>20)
	}
	mode := fs.FileMode(0o644)
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o7777 {
			return WriteOutput{}, fmt.Errorf("mode must be octal permission bits such as 644 or 755, not %q", in.Mode)
		}
		mode = fs.FileMode(m)
	}
	fi, err := t.d.WriteFile(ctx, id, in.Path, bytes.NewReader(data), mode)
	if err != nil {
		return WriteOutput{}, err
	}
	return WriteOutput{Path: in.Path, Size: fi.Size, Mode: strconv.FormatUint(uint64(fi.Mode.Perm()), 8)}, nil
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, id string, in ListInput) (ListOutput, error) {
	if err := checkPath(in.Path); err != nil {
		return ListOutput{}, err
	}
	depth := in.Depth
	if depth == 0 {
		depth = 1
	}
	if depth < 1 || depth > agentwire.MaxListDepth {
		return ListOutput{}, fmt.Errorf("depth must be between 1 and %d", agentwire.MaxListDepth)
	}
	l, err := t.d.ListFiles(ctx, id, in.Path, depth)
	if err != nil {
		return ListOutput{}, err
	}
	out := ListOutput{Files: []File{}}
	for _, f := range l {
		if len(out.Files) == t.lim.ListEntries {
			out.Truncated = true
			break
		}
		p := f.Path
		if p == "" {
			p = path.Join(in.Path, f.Name)
		}
		out.Files = append(out.Files, File{Path: p, Type: fileType(f.Mode), Size: f.Size, Mode: f.Mode.String(), Link: f.Link, ModTime: f.ModTime})
	}
	return out, nil
}

// fileType names a file's type for list_files.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsRegular():
		return "file"
	}
	return "other"
}
