package flatten

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/image/internal/tartest"
)

// ent is one entry of a crafted layer.
type ent = tartest.Ent

func reg(name, data string, mode int64) ent {
	return ent{H: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(1700000000, 0)}, Data: data}
}
func dir(name string, mode int64) ent {
	return ent{H: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: time.Unix(1700000000, 0)}}
}
func symlink(name, target string) ent {
	return ent{H: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}
func hardlink(name, target string) ent {
	return ent{H: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}
func whiteout(name string) ent { return reg(name, "", 0o644) }

// flattenLayers runs both passes and returns the output tar.
func flattenLayers(lim Limits, layers ...[]byte) ([]byte, *Tree, error) {
	tr := New(lim)
	for _, l := range layers {
		if err := tr.AddLayer(bytes.NewReader(l)); err != nil {
			return nil, tr, err
		}
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	_, err := tr.WriteTo(tw, func(i int) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layers[i])), nil
	}, nil)
	if err != nil {
		return nil, tr, err
	}
	if err := tw.Close(); err != nil {
		return nil, tr, err
	}
	return out.Bytes(), tr, nil
}

// listing describes an output tar, one line per path, and checks the
// order invariants WriteTo promises: every path once, parents (as
// directories) before their children, hard links after their target.
func listing(t testing.TB, b []byte) map[string]string {
	t.Helper()
	m, err := describe(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func describe(b []byte) (map[string]string, error) {
	m := map[string]string{}
	kinds := map[string]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return m, nil
		}
		if err != nil {
			return nil, err
		}
		p, err := cleanPath(h.Name)
		if err != nil {
			return nil, fmt.Errorf("output name %q: %v", h.Name, err)
		}
		name := strings.Join(p, "/")
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("output has %q twice", name)
		}
		if len(p) > 0 && p[0] == Reserved {
			return nil, fmt.Errorf("output has %q under the reserved directory", name)
		}
		if len(p) > 0 {
			if parent := strings.Join(p[:len(p)-1], "/"); kinds[parent] != tar.TypeDir {
				return nil, fmt.Errorf("output %q comes before its parent directory %q", name, parent)
			}
		} else if h.Typeflag != tar.TypeDir {
			return nil, fmt.Errorf("output root is not a directory")
		}
		kinds[name] = h.Typeflag
		var d string
		switch h.Typeflag {
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			if int64(len(data)) != h.Size {
				return nil, fmt.Errorf("output %q: %d bytes, header says %d", name, len(data), h.Size)
			}
			d = "file " + string(data)
		case tar.TypeDir:
			d = "dir"
		case tar.TypeSymlink:
			d = "symlink " + h.Linkname
		case tar.TypeLink:
			k, ok := kinds[h.Linkname]
			if !ok || k == tar.TypeDir || k == tar.TypeLink {
				return nil, fmt.Errorf("output hard link %q to %q, not an earlier file", name, h.Linkname)
			}
			d = "link " + h.Linkname
		case tar.TypeChar, tar.TypeBlock:
			d = fmt.Sprintf("dev%c %d:%d", h.Typeflag, h.Devmajor, h.Devminor)
		case tar.TypeFifo:
			d = "fifo"
		default:
			return nil, fmt.Errorf("output %q has type %q", name, h.Typeflag)
		}
		if h.Typeflag != tar.TypeLink {
			d += fmt.Sprintf(" %04o %d:%d", h.Mode, h.Uid, h.Gid)
		}
		var xs []string
		for k, v := range h.PAXRecords {
			if x, ok := strings.CutPrefix(k, xattrPAXPrefix); ok {
				xs = append(xs, x+"="+v)
			}
		}
		sort.Strings(xs)
		if len(xs) > 0 {
			d += " " + strings.Join(xs, ",")
		}
		m[name] = d
	}
}

func TestFlatten(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layers [][]ent
		want   map[string]string // path -> description; paths absent here must be absent
	}{
		{
			name: "whiteout hides a lower file, not the layer's own",
			layers: [][]ent{
				{dir("etc", 0o755), reg("etc/a", "A", 0o644), reg("etc/b", "B", 0o644), reg("etc/c", "C", 0o644)},
				{whiteout("etc/.wh.a"), whiteout("etc/.wh.c"), reg("etc/c", "C2", 0o600), whiteout("etc/.wh.nothing")},
			},
			want: map[string]string{"": "dir 0755 0:0", "etc": "dir 0755 0:0", "etc/b": "file B 0644 0:0", "etc/c": "file C2 0600 0:0"},
		},
		{
			name: "whiteout of a directory removes its subtree",
			layers: [][]ent{
				{dir("d", 0o755), dir("d/e", 0o755), reg("d/e/f", "F", 0o644), reg("g", "G", 0o644)},
				{whiteout(".wh.d")},
			},
			want: map[string]string{"": "dir 0755 0:0", "g": "file G 0644 0:0"},
		},
		{
			name: "opaque directory",
			layers: [][]ent{
				{dir("o", 0o755), reg("o/old", "1", 0o644), dir("o/sub", 0o755), reg("o/sub/x", "2", 0o644)},
				{reg("o/new1", "3", 0o644), dir("o", 0o700), whiteout("o/.wh..wh..opq"), reg("o/new2", "4", 0o644)},
			},
			want: map[string]string{"": "dir 0755 0:0", "o": "dir 0700 0:0", "o/new1": "file 3 0644 0:0", "o/new2": "file 4 0644 0:0"},
		},
		{
			name: "hard links within and across layers",
			layers: [][]ent{
				{reg("bin/a", "prog", 0o755), hardlink("bin/b", "bin/a")},
				{hardlink("usr/c", "/bin/a"), hardlink("./usr/d", "bin/b")},
			},
			want: map[string]string{"": "dir 0755 0:0", "bin": "dir 0755 0:0", "usr": "dir 0755 0:0",
				"bin/a": "file prog 0755 0:0", "bin/b": "link bin/a", "usr/c": "link bin/a", "usr/d": "link bin/a"},
		},
		{
			name: "a link keeps the old contents when its target is replaced",
			layers: [][]ent{
				{reg("a", "old", 0o644), hardlink("b", "a")},
				{reg("a", "new", 0o600)},
			},
			want: map[string]string{"": "dir 0755 0:0", "a": "file new 0600 0:0", "b": "file old 0644 0:0"},
		},
		{
			name: "a link survives its target's whiteout",
			layers: [][]ent{
				{reg("z", "data", 0o640), hardlink("y", "z"), hardlink("x", "z")},
				{whiteout(".wh.z")},
			},
			want: map[string]string{"": "dir 0755 0:0", "x": "file data 0640 0:0", "y": "link x"},
		},
		{
			name: "a link to a symlink",
			layers: [][]ent{
				{symlink("s", "/etc/passwd"), hardlink("t", "s")},
			},
			want: map[string]string{"": "dir 0755 0:0", "s": "symlink /etc/passwd 0777 0:0", "t": "link s"},
		},
		{
			name: "file replaced by a directory and back",
			layers: [][]ent{
				{reg("p", "file", 0o644)},
				{dir("p", 0o755), reg("p/q", "child", 0o644)},
				{reg("p", "file again", 0o600)},
			},
			want: map[string]string{"": "dir 0755 0:0", "p": "file file again 0600 0:0"},
		},
		{
			name: "a directory over a directory keeps its children",
			layers: [][]ent{
				{dir("d", 0o755), reg("d/keep", "k", 0o644)},
				{ent{H: tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o1777, Uid: 5, Gid: 6}}, reg("d/more", "m", 0o644)},
			},
			want: map[string]string{"": "dir 0755 0:0", "d": "dir 1777 5:6", "d/keep": "file k 0644 0:0", "d/more": "file m 0644 0:0"},
		},
		{
			name: "special files, owners, modes, xattrs; the root's own metadata",
			layers: [][]ent{
				{
					ent{H: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o700, Uid: 1, Gid: 2}},
					dir("dev", 0o755),
					ent{H: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}},
					ent{H: tar.Header{Typeflag: tar.TypeBlock, Name: "dev/vda", Mode: 0o660, Gid: 6, Devmajor: 254, Devminor: 0}},
					ent{H: tar.Header{Typeflag: tar.TypeFifo, Name: "run.fifo", Mode: 0o600}},
					ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "/usr/bin/sudo", Mode: 0o4755, Uid: 0, Gid: 0, Size: 1}, Data: "s"},
					ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/wall", Mode: 0o2755, Gid: 5, Size: 1}, Data: "w"},
					ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/ping", Mode: 0o755, Size: 1, Uid: 1000, Gid: 1000,
						PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00", "SCHILY.xattr.user.x": "y"}}, Data: "p"},
				},
			},
			want: map[string]string{
				"": "dir 0700 1:2", "dev": "dir 0755 0:0", "dev/null": "dev3 1:3 0666 0:0", "dev/vda": "dev4 254:0 0660 0:6",
				"run.fifo": "fifo 0600 0:0", "usr": "dir 0755 0:0", "usr/bin": "dir 0755 0:0",
				"usr/bin/sudo": "file s 4755 0:0", "usr/bin/wall": "file w 2755 0:5",
				"usr/bin/ping": "file p 0755 1000:1000 security.capability=\x01\x00\x00\x02\x00\x20\x00\x00,user.x=y",
			},
		},
		{
			name: "names: /x, ./x and x are one path; /.warren is dropped",
			layers: [][]ent{
				{reg("/x", "1", 0o644), reg("./x", "2", 0o644), reg("a//b/./c", "3", 0o644), dir(".warren", 0o755), reg(".warren/image.json", "{}", 0o644)},
				{reg("x", "4", 0o644), whiteout(".wh..warren"), reg("./.warren/evil", "e", 0o644)},
			},
			want: map[string]string{"": "dir 0755 0:0", "x": "file 4 0644 0:0", "a": "dir 0755 0:0", "a/b": "dir 0755 0:0", "a/b/c": "file 3 0644 0:0"},
		},
		{
			name: "same path twice in one layer: the last wins",
			layers: [][]ent{
				{dir("d", 0o755), reg("d/f", "x", 0o644), reg("d", "now a file", 0o644)},
			},
			want: map[string]string{"": "dir 0755 0:0", "d": "file now a file 0644 0:0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var layers [][]byte
			for _, l := range tc.layers {
				layers = append(layers, tartest.Tar(t, l...))
			}
			out, tree, err := flattenLayers(Limits{}, layers...)
			if err != nil {
				t.Fatal(err)
			}
			got := listing(t, out)
			for p, w := range tc.want {
				if got[p] != w {
					t.Errorf("%q: got %q, want %q", p, got[p], w)
				}
			}
			for p := range got {
				if _, ok := tc.want[p]; !ok {
					t.Errorf("unexpected path %q: %q", p, got[p])
				}
			}
			s := tree.Stats()
			if s.Dirs+s.Files+s.Symlinks+s.Specials+s.HardLinks != len(got) {
				t.Errorf("stats %+v do not add up to %d paths", s, len(got))
			}
		})
	}
}

func TestFlattenMtimeAndContentBytes(t *testing.T) {
	l := tartest.Tar(t, reg("a", "12345", 0o644), hardlink("b", "a"), reg("c", "xy", 0o644))
	out, tree, err := flattenLayers(Limits{}, l)
	if err != nil {
		t.Fatal(err)
	}
	if s := tree.Stats(); s.ContentBytes != 7 || s.Files != 2 || s.HardLinks != 1 {
		t.Fatalf("stats %+v, want 7 content bytes in 2 files and 1 link", s)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if h.Name == "a" && !h.ModTime.Equal(time.Unix(1700000000, 0)) {
			t.Fatalf("mtime of a: %v", h.ModTime)
		}
	}
}

func TestFlattenRefuses(t *testing.T) {
	long := strings.Repeat("n", MaxNameBytes+1)
	deep := strings.Repeat("d/", MaxPathBytes/2+1) + "f"
	bigX := map[string]string{"SCHILY.xattr.user.big": strings.Repeat("v", MaxXattrBytes)}
	for _, tc := range []struct {
		name   string
		layers [][]ent
		want   string
	}{
		{"dot-dot", [][]ent{{reg("../escape", "x", 0o644)}}, `".." component`},
		{"dot-dot inside", [][]ent{{reg("a/../../b", "x", 0o644)}}, `".." component`},
		{"absolute dot-dot", [][]ent{{reg("/../../etc/passwd", "x", 0o644)}}, `".." component`},
		{"long component", [][]ent{{reg(long, "x", 0o644)}}, "name component of 256 bytes"},
		{"long path", [][]ent{{reg(deep, "x", 0o644)}}, "more than 4096"},
		{"parent is a symlink", [][]ent{{symlink("lib", "/usr/lib"), reg("lib/x", "x", 0o644)}}, `parent "lib" is a symlink`},
		{"parent is a symlink out of the tree", [][]ent{{symlink("up", "../../../../tmp")}, {reg("up/owned", "x", 0o644)}}, `parent "up" is a symlink`},
		{"parent is a file", [][]ent{{reg("f", "x", 0o644)}, {reg("f/child", "x", 0o644)}}, `parent "f" is not a directory`},
		{"hard link to nothing", [][]ent{{hardlink("l", "missing")}}, "does not exist"},
		{"hard link to a later entry", [][]ent{{hardlink("l", "t"), reg("t", "x", 0o644)}}, "does not exist"},
		{"hard link to a directory", [][]ent{{dir("d", 0o755), hardlink("l", "d")}}, "hard link to directory"},
		{"hard link out of the tree", [][]ent{{hardlink("l", "../etc/shadow")}}, `".." component`},
		{"hard link into /.warren", [][]ent{{reg(".warren/x", "x", 0o644), hardlink("l", ".warren/x")}}, "does not exist"},
		{"hard link through a symlink", [][]ent{{dir("real", 0o755), reg("real/f", "x", 0o644), symlink("s", "real"), hardlink("l", "s/f")}}, "does not exist"},
		{"hard link to the root", [][]ent{{hardlink("l", "./")}}, "hard link to the root"},
		{"root is a file", [][]ent{{ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "."}}}}, "root is not a directory"},
		{"aufs metadata", [][]ent{{whiteout(".wh..wh.plnk")}}, "aufs"},
		{"empty whiteout", [][]ent{{whiteout("d/.wh.")}}, "names nothing"},
		{"acl", [][]ent{{ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "f", PAXRecords: map[string]string{"SCHILY.xattr.system.posix_acl_access": "x"}}}}}, "ACLs"},
		{"big xattrs", [][]ent{{ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "f", PAXRecords: bigX}}}}, "xattrs of more than"},
		{"device number", [][]ent{{ent{H: tar.Header{Typeflag: tar.TypeChar, Name: "c", Devmajor: 1 << 12}}}}, "out of range"},
		{"entry type", [][]ent{{ent{H: tar.Header{Typeflag: 'Z', Name: "z"}}}}, "tar entry type"},
		{"empty symlink", [][]ent{{ent{H: tar.Header{Typeflag: tar.TypeSymlink, Name: "s"}}}}, "empty target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var layers [][]byte
			for _, l := range tc.layers {
				layers = append(layers, tartest.Tar(t, l...))
			}
			_, _, err := flattenLayers(Limits{}, layers...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "layer ") {
				t.Fatalf("error %q does not name the layer", err)
			}
		})
	}
}

func TestParseEntryRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    tar.Header
		want string
	}{
		{"nul in name", tar.Header{Typeflag: tar.TypeReg, Name: "a\x00b"}, "NUL"},
		{"nul in symlink", tar.Header{Typeflag: tar.TypeSymlink, Name: "s", Linkname: "a\x00"}, "NUL"},
		{"long symlink", tar.Header{Typeflag: tar.TypeSymlink, Name: "s", Linkname: strings.Repeat("x", MaxSymlinkBytes+1)}, "symlink target of"},
		{"negative uid", tar.Header{Typeflag: tar.TypeReg, Name: "f", Uid: -1}, "owner"},
		{"huge gid", tar.Header{Typeflag: tar.TypeReg, Name: "f", Gid: 1 << 33}, "owner"},
		{"negative mode", tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: -1}, "negative mode"},
		{"negative size", tar.Header{Typeflag: tar.TypeReg, Name: "f", Size: -1}, "negative size"},
		{"negative minor", tar.Header{Typeflag: tar.TypeBlock, Name: "b", Devminor: -1}, "out of range"},
		{"bad xattr name", tar.Header{Typeflag: tar.TypeReg, Name: "f", PAXRecords: map[string]string{"SCHILY.xattr.": "v"}}, "xattr name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseEntry(&tc.h, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestFlattenLimits(t *testing.T) {
	var ents []ent
	for i := range 50 {
		ents = append(ents, reg("f"+strconv.Itoa(i), "", 0o644))
	}
	if _, _, err := flattenLayers(Limits{MaxEntries: 20}, tartest.Tar(t, ents...)); err == nil || !strings.Contains(err.Error(), "more than 20 entries") {
		t.Fatalf("entry limit: %v", err)
	}
	// Implied parent directories count too.
	if _, _, err := flattenLayers(Limits{MaxEntries: 20}, tartest.Tar(t, reg(strings.Repeat("d/", 30)+"f", "", 0o644))); err == nil || !strings.Contains(err.Error(), "more than 20 entries") {
		t.Fatalf("implied directories: %v", err)
	}
	x := map[string]string{"SCHILY.xattr.user.v": strings.Repeat("v", 3000)}
	ents = nil
	for i := range 10 {
		ents = append(ents, ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "x" + strconv.Itoa(i), PAXRecords: x}})
	}
	if _, _, err := flattenLayers(Limits{MaxMetadataBytes: 20000}, tartest.Tar(t, ents...)); err == nil || !strings.Contains(err.Error(), "bytes of names") {
		t.Fatalf("metadata limit: %v", err)
	}
}

// TestFlattenPassesDisagree: pass 2 checks it copies the entries pass 1
// chose.
func TestFlattenPassesDisagree(t *testing.T) {
	l1 := tartest.Tar(t, reg("a", "one", 0o644))
	l2 := tartest.Tar(t, reg("a", "two!", 0o644))
	tree := New(Limits{})
	if err := tree.AddLayer(bytes.NewReader(l1)); err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(io.Discard)
	_, err := tree.WriteTo(tw, func(int) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(l2)), nil }, nil)
	if err == nil || !strings.Contains(err.Error(), "changed between passes") {
		t.Fatalf("got %v", err)
	}
	_, err = tree.WriteTo(tw, func(int) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(nil)), nil }, nil)
	if err == nil || !strings.Contains(err.Error(), "changed between passes") {
		t.Fatalf("truncated layer: got %v", err)
	}
}

// TestAddLayerReadsToTheEnd: bytes after the end-of-archive blocks are
// read too (they are part of the layer's diff_id).
func TestAddLayerReadsToTheEnd(t *testing.T) {
	l := append(tartest.Tar(t, reg("a", "x", 0o644)), make([]byte, 10000)...)
	r := bytes.NewReader(l)
	if err := New(Limits{}).AddLayer(r); err != nil {
		t.Fatal(err)
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes left unread", r.Len())
	}
}

func FuzzFlatten(f *testing.F) {
	for _, s := range seedLayers(f) {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		lim := Limits{MaxEntries: 2000, MaxMetadataBytes: 1 << 20}
		out, tree, err := flattenLayers(lim, a, b)
		if err != nil {
			return
		}
		m, err := describe(out)
		if err != nil {
			t.Fatalf("output breaks an invariant: %v", err)
		}
		s := tree.Stats()
		if n := s.Dirs + s.Files + s.Symlinks + s.Specials + s.HardLinks; n != len(m) {
			t.Fatalf("stats %+v count %d paths, the output has %d", s, n, len(m))
		}
		// The output is a valid one-layer image with the same tree.
		again, _, err := flattenLayers(lim, out)
		if err != nil {
			t.Fatalf("the output does not flatten again: %v", err)
		}
		m2, err := describe(again)
		if err != nil {
			t.Fatal(err)
		}
		if len(m2) != len(m) {
			t.Fatalf("flattening the output gives %d paths, not %d", len(m2), len(m))
		}
		for k, v := range m {
			if w := m2[k]; w != v && !strings.HasPrefix(v, "link ") {
				t.Fatalf("%q: %q after a second flatten, %q before", k, w, v)
			}
		}
	})
}

// seedLayers are the fuzz seeds (also written under testdata/fuzz by
// TestWriteFuzzSeeds).
func seedLayers(t testing.TB) [][2][]byte {
	return [][2][]byte{
		{tartest.Tar(t, dir("etc", 0o755), reg("etc/a", "A", 0o644), reg("b", "B", 0o4755)), tartest.Tar(t, whiteout("etc/.wh.a"), reg("c", "C", 0o644))},
		{tartest.Tar(t, dir("o", 0o755), reg("o/x", "1", 0o644)), tartest.Tar(t, whiteout("o/.wh..wh..opq"), reg("o/y", "2", 0o644))},
		{tartest.Tar(t, reg("a", "old", 0o644), hardlink("b", "a")), tartest.Tar(t, reg("a", "new", 0o644), hardlink("c", "b"))},
		{tartest.Tar(t, symlink("lib", "usr/lib"), ent{H: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}}), tartest.Tar(t, reg("lib/x", "x", 0o644))},
		{tartest.Tar(t, reg("p", "f", 0o644)), tartest.Tar(t, dir("p", 0o755), reg("p/q", "c", 0o600), reg(".warren/z", "z", 0o644))},
		{tartest.Tar(t, ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "x", PAXRecords: map[string]string{"SCHILY.xattr.user.a": "b"}}}), tartest.Tar(t, reg("../x", "", 0o644))},
	}
}

// TestWriteFuzzSeeds rewrites testdata/fuzz/FuzzFlatten from seedLayers
// when WARREN_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("WARREN_WRITE_SEEDS") != "1" {
		t.Skip("set WARREN_WRITE_SEEDS=1 to rewrite the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzFlatten")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range seedLayers(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n[]byte(%q)\n", s[0], s[1])
		sum := sha256.Sum256([]byte(body))
		if err := os.WriteFile(filepath.Join(dir, hex.EncodeToString(sum[:8])), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
