//go:build linux

package agent

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/warrenvm/warren/agentwire"
)

// The file API beyond reading and writing one file (files.go): listings
// of a tree, directories made, files removed and renamed.

// absParam returns the absolute, cleaned query parameter name.
func absParam(r *http.Request, name string) (string, *agentwire.Error) {
	p := r.URL.Query().Get(name)
	if p == "" {
		return "", badRequest("missing %s parameter", name)
	}
	if !filepath.IsAbs(p) {
		return "", badRequest("%s %q is not absolute", name, p)
	}
	return filepath.Clean(p), nil
}

// parseMode parses octal permission bits (with setuid, setgid and sticky
// bits); "" is def.
func parseMode(m string, def fs.FileMode) (fs.FileMode, *agentwire.Error) {
	if m == "" {
		return def, nil
	}
	v, err := strconv.ParseUint(m, 8, 32)
	if err != nil || v&^0o7777 != 0 {
		return 0, badRequest("mode %q is not octal permission bits", m)
	}
	return fs.FileMode(v&0o777) | unixModeBits(uint32(v)), nil
}

// pathInfo is fileInfo with Path set.
func pathInfo(full string, fi fs.FileInfo) agentwire.FileInfo {
	info := fileInfo(full, fi)
	info.Path = full
	return info
}

// handleList serves GET /list?path=&depth=N: the entries under the
// directory, depth levels down (default 1).
func handleList(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		methodNotAllowed(w, r, "GET")
		return
	}
	p, e := queryPath(r)
	if e != nil {
		writeError(w, e)
		return
	}
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > agentwire.MaxListDepth {
			writeError(w, badRequest("depth %q: want 1 to %d", v, agentwire.MaxListDepth))
			return
		}
		depth = n
	}
	l, err := listTree(p, depth, agentwire.MaxListEntries)
	writeResult(w, l, err)
}

// listTree lists the directory root and, depth levels down, the
// directories under it (not those behind symbolic links), each entry with
// its Path: parents before their children, siblings by name. A
// subdirectory it cannot read is listed without its entries. More than
// maxEntries entries is an error.
func listTree(root string, depth, maxEntries int) ([]agentwire.FileInfo, error) {
	out := []agentwire.FileInfo{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		ents, err := os.ReadDir(dir) // sorted by name
		if err != nil {
			if level == 1 {
				return err
			}
			return nil
		}
		for _, de := range ents {
			fi, err := de.Info()
			if err != nil {
				continue // removed since ReadDir
			}
			if len(out) >= maxEntries {
				return badRequest("too many entries: more than %d under %s", maxEntries, root)
			}
			full := filepath.Join(dir, de.Name())
			out = append(out, pathInfo(full, fi))
			if level < depth && fi.IsDir() { // lstat: a link to a directory is no directory
				if err := walk(full, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return nil, err
	}
	return out, nil
}

// handleMkdir serves POST /mkdir?path=&mode=&parents=1: the directory
// made with mode's permission bits (default 0755, exactly: not masked by
// the umask), its missing parents too with parents=1 (0755 less the
// umask), when an existing directory is no error.
func handleMkdir(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, "POST")
		return
	}
	p, e := queryPath(r)
	if e != nil {
		writeError(w, e)
		return
	}
	mode, e := parseMode(r.URL.Query().Get("mode"), 0o755)
	if e != nil {
		writeError(w, e)
		return
	}
	fi, err := mkdir(p, mode, r.URL.Query().Get("parents") == "1")
	writeResult(w, fi, err)
}

// mkdir makes the directory p with mode (and its parents when parents is
// set) and returns its FileInfo.
func mkdir(p string, mode fs.FileMode, parents bool) (agentwire.FileInfo, error) {
	if parents {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return agentwire.FileInfo{}, err
		}
	}
	err := os.Mkdir(p, mode)
	switch {
	case err == nil:
		// Mkdir's mode is masked by the umask and drops the setuid,
		// setgid and sticky bits; Chmod sets them as asked.
		if err := os.Chmod(p, mode); err != nil {
			return agentwire.FileInfo{}, err
		}
	case parents && errors.Is(err, fs.ErrExist):
		// An existing directory is fine; an existing file is not.
	default:
		return agentwire.FileInfo{}, err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return agentwire.FileInfo{}, err
	}
	if !fi.IsDir() {
		return agentwire.FileInfo{}, &agentwire.Error{Message: p + " exists and is not a directory", Code: agentwire.CodeExists, Status: http.StatusConflict}
	}
	return pathInfo(p, fi), nil
}

// removePath is DELETE /files?path=&recursive=1: the file or empty
// directory removed, or with recursive the directory and everything under
// it (symbolic links removed, not followed). A missing path is not_found;
// "/" is never removed.
func removePath(p string, recursive bool) error {
	if p == "/" {
		return badRequest("refusing to remove /")
	}
	if _, err := os.Lstat(p); err != nil {
		return err
	}
	if recursive {
		return os.RemoveAll(p)
	}
	return os.Remove(p)
}

// handleRename serves POST /rename?from=&to=: rename(2), answered with
// to's FileInfo.
func handleRename(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, "POST")
		return
	}
	from, e := absParam(r, "from")
	if e == nil {
		var to string
		if to, e = absParam(r, "to"); e == nil {
			fi, err := rename(from, to)
			writeResult(w, fi, err)
			return
		}
	}
	writeError(w, e)
}

// rename renames from to to and returns to's FileInfo.
func rename(from, to string) (agentwire.FileInfo, error) {
	if from == "/" || to == "/" {
		return agentwire.FileInfo{}, badRequest("refusing to rename /")
	}
	if err := os.Rename(from, to); err != nil {
		return agentwire.FileInfo{}, err
	}
	fi, err := os.Lstat(to)
	if err != nil {
		return agentwire.FileInfo{}, err
	}
	return pathInfo(to, fi), nil
}
