//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentwire"
)

// GET /watch: changes under a directory, from inotify, as NDJSON
// agentwire.WatchEvent lines.

// watchMask is what a watch reports of each directory.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watchReadSize is the inotify read buffer: many events per read.
const watchReadSize = 64 << 10

// watcher is one GET /watch's inotify instance and its watches. One
// goroutine (the handler's) uses it; a context's AfterFunc only sets the
// file's read deadline.
type watcher struct {
	f         *os.File // the inotify instance, non-blocking, in the poller
	fd        int      // f's descriptor, valid until close
	root      string
	rootWd    int32
	recursive bool
	max       int              // watches at most
	dirs      map[int32]string // watched directory by watch descriptor
	wds       map[string]int32 // and the reverse
}

// newWatcher watches root (a directory; a link to one is followed) and,
// when recursive, every directory under it (links not followed), at most
// max directories: more is an error.
func newWatcher(root string, recursive bool, max int) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	w := &watcher{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, root: root, recursive: recursive, max: max,
		dirs: map[int32]string{}, wds: map[string]int32{}}
	wd, err := unix.InotifyAddWatch(fd, root, watchMask)
	if err != nil {
		w.close()
		return nil, &os.PathError{Op: "watch", Path: root, Err: err}
	}
	w.rootWd = int32(wd)
	w.dirs[w.rootWd], w.wds[root] = root, w.rootWd
	if recursive {
		if over := w.addTree(root, nil); over != "" {
			w.close()
			return nil, badRequest("watch %s: more than %d directories", root, max)
		}
	}
	return w, nil
}

// close closes the inotify instance, which removes its watches.
func (w *watcher) close() { w.f.Close() }

// add watches the directory dir (not following a link); it reports
// whether dir is watched.
func (w *watcher) add(dir string) bool {
	if _, ok := w.wds[dir]; ok {
		return true
	}
	if len(w.dirs) >= w.max {
		return false
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask|unix.IN_DONT_FOLLOW)
	if err != nil {
		return false // gone already, or not a directory any more
	}
	if old, ok := w.dirs[int32(wd)]; ok { // the same directory under another name
		delete(w.wds, old)
	}
	w.dirs[int32(wd)], w.wds[dir] = dir, int32(wd)
	return true
}

// addTree watches the directories under dir (dir itself must already be
// watched), calling found, when not nil, for every entry under it: those
// created before their directory was watched have no event of their own.
// It returns the first directory it could not watch for the bound, "" if
// none.
func (w *watcher) addTree(dir string, found func(path string, isDir bool)) (over string) {
	_ = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil // unreadable or gone: skipped
		}
		if found != nil {
			found(p, de.IsDir())
		}
		if !de.IsDir() {
			return nil
		}
		if !w.add(p) {
			if len(w.dirs) >= w.max {
				over = p
				return filepath.SkipAll
			}
			return filepath.SkipDir
		}
		return nil
	})
	return over
}

// forget drops the watches of dir and the directories under it (moved
// away: their paths are no longer theirs).
func (w *watcher) forget(dir string) {
	for p, wd := range w.wds {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.wds, p)
			delete(w.dirs, wd)
		}
	}
}

// events turns the inotify events in buf into WatchEvents (adding the
// watches of new directories on the way, when recursive); end says the
// watched directory is gone and the stream ends.
func (w *watcher) events(buf []byte, now time.Time) (evs []agentwire.WatchEvent, end bool) {
	emit := func(op, path string, isDir bool) {
		evs = append(evs, agentwire.WatchEvent{Op: op, Path: path, IsDir: isDir, Time: now})
	}
	for off := 0; off+unix.SizeofInotifyEvent <= len(buf); {
		wd := int32(binary.NativeEndian.Uint32(buf[off:]))
		mask := binary.NativeEndian.Uint32(buf[off+4:])
		nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
		off += unix.SizeofInotifyEvent
		if nameLen > len(buf)-off {
			break // never from the kernel: whole events only
		}
		name := string(bytes.TrimRight(buf[off:off+nameLen], "\x00"))
		off += nameLen

		if mask&unix.IN_Q_OVERFLOW != 0 {
			emit("overflow", w.root, true)
			continue
		}
		dir, ok := w.dirs[wd]
		if !ok {
			continue // a watch already forgotten
		}
		isDir := mask&unix.IN_ISDIR != 0
		path := dir
		if name != "" {
			path = filepath.Join(dir, name)
		}
		switch {
		case mask&unix.IN_IGNORED != 0:
			delete(w.dirs, wd)
			if w.wds[dir] == wd {
				delete(w.wds, dir)
			}
			if wd == w.rootWd {
				return evs, true
			}
		case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
			emit("create", path, isDir)
			if isDir && w.recursive {
				if !w.add(path) {
					emit("overflow", path, true)
					continue
				}
				if over := w.addTree(path, func(p string, d bool) { emit("create", p, d) }); over != "" {
					emit("overflow", over, true)
				}
			}
		case mask&unix.IN_MODIFY != 0:
			emit("write", path, isDir)
		case mask&unix.IN_DELETE != 0:
			emit("remove", path, isDir)
		case mask&unix.IN_MOVED_FROM != 0:
			emit("rename", path, isDir)
			if isDir {
				w.forget(path)
			}
		case mask&unix.IN_ATTRIB != 0:
			emit("chmod", path, isDir)
		case mask&unix.IN_DELETE_SELF != 0 && wd == w.rootWd:
			emit("remove", w.root, true)
		case mask&unix.IN_MOVE_SELF != 0 && wd == w.rootWd:
			emit("rename", w.root, true)
			return evs, true // its paths are no longer its own
		}
	}
	return evs, false
}

// handleWatch serves GET /watch?path=&recursive=1: the "ready" line once
// the watches are in place, then the changes as they come, until the
// client goes away or the directory is removed or moved.
func handleWatch(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		methodNotAllowed(w, r, "GET")
		return
	}
	root, e := queryPath(r)
	if e != nil {
		writeError(w, e)
		return
	}
	wt, err := newWatcher(root, r.URL.Query().Get("recursive") == "1", agentwire.MaxWatches)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			err = badRequest("watch %s: the kernel's inotify watch limit is reached", root)
		}
		writeError(w, errorFrom(err))
		return
	}
	defer wt.close()
	// The client going away ends a Read under way.
	stop := context.AfterFunc(r.Context(), func() { _ = wt.f.SetReadDeadline(time.Now()) })
	defer stop()

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if enc.Encode(agentwire.WatchEvent{Op: "ready", Path: root, IsDir: true, Time: time.Now()}) != nil || rc.Flush() != nil {
		return
	}
	buf := make([]byte, watchReadSize)
	for {
		n, err := wt.f.Read(buf)
		if err != nil {
			return
		}
		evs, end := wt.events(buf[:n], time.Now())
		for _, ev := range evs {
			if enc.Encode(ev) != nil {
				return
			}
		}
		if rc.Flush() != nil || end {
			return
		}
	}
}
