//go:build linux

package agent

import (
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/guestinit/etc"
)

// queryPath returns the absolute, cleaned path= parameter.
func queryPath(r *http.Request) (string, *agentwire.Error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", badRequest("missing path parameter")
	}
	if !filepath.IsAbs(p) {
		return "", badRequest("path %q is not absolute", p)
	}
	return filepath.Clean(p), nil
}

// fileInfo converts an lstat result; full is the file's path.
func fileInfo(full string, fi fs.FileInfo) agentwire.FileInfo {
	info := agentwire.FileInfo{Name: fi.Name(), Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime(), IsDir: fi.IsDir()}
	if fi.Mode()&fs.ModeSymlink != 0 {
		info.Link, _ = os.Readlink(full)
	}
	return info
}

func (s *Server) handleFiles(w http.ResponseWriter, r *http.Request) {
	p, e := queryPath(r)
	if e != nil {
		writeError(w, e)
		return
	}
	switch r.Method {
	case http.MethodGet:
		readFile(w, p)
	case http.MethodPut:
		mode, e := parseMode(r.URL.Query().Get("mode"), 0o644)
		if e != nil {
			writeError(w, e)
			return
		}
		fi, err := writeFile(p, r.Body, mode)
		writeResult(w, fi, err)
	case http.MethodDelete:
		if err := removePath(p, r.URL.Query().Get("recursive") == "1"); err != nil {
			writeError(w, errorFrom(err))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		methodNotAllowed(w, r, "GET, PUT, DELETE")
	}
}

// unixModeBits turns setuid, setgid and sticky bits into fs.FileMode bits.
func unixModeBits(v uint32) fs.FileMode {
	var m fs.FileMode
	if v&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func readFile(w http.ResponseWriter, p string) {
	f, err := os.Open(p)
	if err != nil {
		writeError(w, errorFrom(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, errorFrom(err))
		return
	}
	if fi.IsDir() {
		writeError(w, &agentwire.Error{Message: p + " is a directory", Code: agentwire.CodeIsDirectory, Status: http.StatusBadRequest})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(agentwire.ModeHeader, strconv.FormatUint(uint64(fi.Mode().Perm()), 8))
	if fi.Mode().IsRegular() {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	}
	// A failure from here on can only cut the body short; the client sees
	// a length mismatch (regular files) or a truncated chunked body.
	_, _ = io.Copy(w, f)
}

// writeFile replaces p with the contents of r, atomically and durably
// (etc.WriteFileFrom: a temporary file in the same directory, fsync,
// rename), so readers never see a partial file. The new file has mode and
// the agent's ownership.
func writeFile(p string, r io.Reader, mode fs.FileMode) (agentwire.FileInfo, error) {
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return agentwire.FileInfo{}, &agentwire.Error{Message: p + " is a directory", Code: agentwire.CodeIsDirectory, Status: http.StatusBadRequest}
	}
	if err := etc.WriteFileFrom(p, r, mode); err != nil {
		return agentwire.FileInfo{}, err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return agentwire.FileInfo{}, err
	}
	return fileInfo(p, fi), nil
}

// getPath answers a GET with the path= parameter: what fn returns for
// the path, as JSON, or its error.
func getPath(fn func(p string) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			methodNotAllowed(w, r, "GET")
			return
		}
		p, e := queryPath(r)
		if e != nil {
			writeError(w, e)
			return
		}
		v, err := fn(p)
		writeResult(w, v, err)
	}
}

// statFile is GET /stat: the file's lstat.
func statFile(p string) (any, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	return fileInfo(p, fi), nil
}
