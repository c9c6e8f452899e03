package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/Microsoft/hcsshim/ext4/tar2ext4"

	"github.com/warrenvm/warren/guestinit/imageconfig"
	"github.com/warrenvm/warren/image/flatten"
)

// The ext4 side of a build.
//
// tar2ext4 writes a compact file system: exactly the content, no free
// blocks, no journal, a nil UUID, the "read-only" feature, and an inode
// table sized to the content (its inodes-per-group is chosen to make the
// fewest block groups). finish turns it into an ordinary writable file
// system of the asked size, offline, with e2fsprogs:
//
//	tune2fs -O ^read-only -U UUID -e remount-ro   writable, a UUID from the key
//	e2fsck -fy                                     fixes tar2ext4's unset bitmap padding
//	resize2fs IMG SIZE                             (after a sparse truncate to SIZE)
//	debugfs -w: rm the padding (below), ssv hash_seed UUID
//	tune2fs -O has_journal,dir_index
//	e2fsck -fyD                                    indexes directories
//	e2fsck -fn                                     must find nothing
//
// resize2fs keeps inodes-per-group, so the added groups have the content's
// inode density. A Debian image has about one inode per 32 KiB of content,
// and an image of a few big files far fewer: too few for a workspace
// (node_modules, git objects). So the compact image is padded with empty
// files under /.warren/.pad, enough that tar2ext4 picks 8192 inodes per
// group (one inode per 16 KiB, mke2fs's default ratio); they are removed
// with debugfs once the file system is resized, leaving the inodes free.
//
// Every tool runs with its clock fixed (E2FSPROGS_FAKE_TIME, E2FSCK_TIME)
// and no configuration files, and the UUID and directory hash seed come
// from the key: the same image gives the same bytes.

// Tools are the e2fsprogs programs finish runs; an empty field is looked
// up on PATH, then in /sbin and /usr/sbin.
type Tools struct {
	E2fsck, Tune2fs, Resize2fs, Debugfs, Dumpe2fs string
}

func (t Tools) resolve() (Tools, error) {
	for _, f := range []struct {
		p    *string
		name string
	}{{&t.E2fsck, "e2fsck"}, {&t.Tune2fs, "tune2fs"}, {&t.Resize2fs, "resize2fs"}, {&t.Debugfs, "debugfs"}, {&t.Dumpe2fs, "dumpe2fs"}} {
		if *f.p != "" {
			continue
		}
		p, err := exec.LookPath(f.name)
		if err != nil {
			for _, d := range []string{"/sbin", "/usr/sbin"} {
				if fi, serr := os.Stat(filepath.Join(d, f.name)); serr == nil && fi.Mode()&0o111 != 0 {
					p, err = filepath.Join(d, f.name), nil
					break
				}
			}
		}
		if err != nil {
			return t, fmt.Errorf("image build: %s not found (install e2fsprogs)", f.name)
		}
		*f.p = p
	}
	return t, nil
}

// fakeTime is the clock e2fsprogs see (2023-11-14): fixed so builds are
// reproducible.
const fakeTime = "1700000000"

// run runs one tool, accepting the exit codes in ok (e2fsck exits 1 when
// it fixed something).
func (t Tools) run(ctx context.Context, ok []int, stderr *bytes.Buffer, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "E2FSPROGS_FAKE_TIME="+fakeTime, "E2FSCK_TIME="+fakeTime,
		"E2FSCK_CONFIG=/dev/null", "MKE2FS_CONFIG=/dev/null", "PAGER=__none__", "DEBUGFS_PAGER=__none__")
	var out bytes.Buffer
	cmd.Stdout = &out
	if stderr != nil {
		cmd.Stderr = stderr
	} else {
		cmd.Stderr = &out
	}
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return fmt.Errorf("%s: %w", filepath.Base(prog), err)
		}
		code = ee.ExitCode()
	}
	for _, c := range ok {
		if c == code {
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	msg := strings.TrimSpace(out.String())
	if stderr != nil {
		msg = strings.TrimSpace(msg + "\n" + stderr.String())
	}
	if len(msg) > 2000 {
		msg = "..." + msg[len(msg)-2000:]
	}
	return fmt.Errorf("%s %s: exit status %d: %s", filepath.Base(prog), strings.Join(args[:len(args)-1], " "), code, msg)
}

// fsStats are counts dumpe2fs reports.
type fsStats struct{ inodes, freeInodes int64 }

// finish makes the compact image at img a writable file system of disk
// bytes (see the comment at the top of this file).
func (t Tools) finish(ctx context.Context, img string, disk int64, uuid string, pad int) (fsStats, error) {
	fi, err := os.Stat(img)
	if err != nil {
		return fsStats{}, err
	}
	if need := fi.Size() + journalBytes(disk) + fi.Size()/20 + 16<<20; disk < need {
		return fsStats{}, fmt.Errorf("a disk of %d bytes is too small for this image (%d bytes as a compact ext4): ask for at least %d MiB",
			disk, fi.Size(), (need+1<<20-1)>>20)
	}
	if err := t.run(ctx, []int{0}, nil, t.Tune2fs, "-O", "^read-only", "-U", uuid, "-e", "remount-ro", img); err != nil {
		return fsStats{}, err
	}
	if err := t.run(ctx, []int{0, 1}, nil, t.E2fsck, "-fy", img); err != nil {
		return fsStats{}, err
	}
	if err := os.Truncate(img, disk); err != nil {
		return fsStats{}, err
	}
	if err := t.run(ctx, []int{0}, nil, t.Resize2fs, img, strconv.FormatInt(disk>>10, 10)+"K"); err != nil {
		return fsStats{}, err
	}
	var cmds bytes.Buffer
	for _, p := range padPaths(pad) {
		if strings.HasSuffix(p, "/") {
			fmt.Fprintf(&cmds, "rmdir /%s\n", strings.TrimSuffix(p, "/"))
		} else {
			fmt.Fprintf(&cmds, "rm /%s\n", p)
		}
	}
	fmt.Fprintf(&cmds, "ssv hash_seed %s\n", uuid)
	cf := img + ".debugfs"
	if err := os.WriteFile(cf, cmds.Bytes(), 0o600); err != nil {
		return fsStats{}, err
	}
	var derr bytes.Buffer
	err = t.run(ctx, []int{0}, &derr, t.Debugfs, "-w", "-f", cf, img)
	os.Remove(cf)
	if err != nil {
		return fsStats{}, err
	}
	// debugfs exits 0 whatever its commands did: anything on stderr but
	// its banner is a failure.
	for _, l := range strings.Split(strings.TrimSpace(derr.String()), "\n") {
		if l != "" && !strings.HasPrefix(l, "debugfs ") {
			return fsStats{}, fmt.Errorf("debugfs: %s", strings.TrimSpace(derr.String()))
		}
	}
	if err := t.run(ctx, []int{0}, nil, t.Tune2fs, "-O", "has_journal,dir_index", img); err != nil {
		return fsStats{}, err
	}
	if err := t.run(ctx, []int{0, 1}, nil, t.E2fsck, "-fyD", img); err != nil {
		return fsStats{}, err
	}
	if err := t.run(ctx, []int{0}, nil, t.E2fsck, "-fn", img); err != nil {
		return fsStats{}, fmt.Errorf("the finished file system does not check clean: %w", err)
	}
	st, err := t.stats(ctx, img)
	if err != nil {
		return fsStats{}, err
	}
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return fsStats{}, err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return st, err
}

// stats reads the inode counts from the superblock (dumpe2fs -h).
func (t Tools) stats(ctx context.Context, img string) (fsStats, error) {
	cmd := exec.CommandContext(ctx, t.Dumpe2fs, "-h", img)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.Output()
	if err != nil {
		return fsStats{}, fmt.Errorf("dumpe2fs: %w", err)
	}
	var st fsStats
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "Inode count":
			st.inodes = n
		case "Free inodes":
			st.freeInodes = n
		}
	}
	if st.inodes == 0 {
		return st, errors.New("dumpe2fs: no inode count in its output")
	}
	return st, nil
}

// journalSizes is e2fsprogs' ext2fs_default_journal_size in 4 KiB
// blocks: the journal of a file system of fewer than below blocks, the
// first row that fits; a larger one's is 262144 blocks.
var journalSizes = []struct{ below, journal int64 }{
	{32768, 1024}, {256 * 1024, 4096}, {512 * 1024, 8192}, {4096 * 1024, 16384},
	{8192 * 1024, 32768}, {16384 * 1024, 65536}, {32768 * 1024, 131072},
}

// journalBytes is the journal tune2fs makes for a file system of disk
// bytes (journalSizes).
func journalBytes(disk int64) int64 {
	blocks := disk / 4096
	for _, s := range journalSizes {
		if blocks < s.below {
			return s.journal * 4096
		}
	}
	return 262144 * 4096
}

// estimateDisk is about the smallest disk the tree fits in: its data, its
// inode table at the target density, a journal, and 5 % slack.
func estimateDisk(st flatten.Stats) int64 {
	data := st.DataBlocks * 4096
	inodes := int64(st.Inodes()) * 256
	return data + inodes + data/20 + journalBytes(data) + 16<<20
}

// Inode padding (see the comment at the top of this file).
const (
	blocksPerGroup  = 32768
	targetIPG       = 8192 // inodes per group: one per 16 KiB
	padPerDir       = 256
	reservedInodes  = 11 // ext4's first inodes; the root and lost+found among them
	warrenInodes    = 2  // /.warren and /.warren/image.json
	padDir          = flatten.Reserved + "/.pad"
	groupDataBlocks = blocksPerGroup - targetIPG*256/4096 - 2
)

// padInodes is how many empty files make tar2ext4 choose at least
// targetIPG inodes per group for a tree like st.
func padInodes(st flatten.Stats) int {
	// Blocks before the inode table: data, plus some for extent
	// trees, xattr blocks and the descriptors.
	blocks := st.DataBlocks + st.DataBlocks/50 + 64
	groups := (blocks + groupDataBlocks - 1) / groupDataBlocks
	want := groups * targetIPG
	have := int64(reservedInodes + st.Inodes() - 1 + warrenInodes)
	missing := want - have - 1 // the .pad directory
	if missing <= 0 {
		return 0
	}
	// n files need ceil(n/padPerDir) directories.
	return int(missing * padPerDir / (padPerDir + 1))
}

// padPaths are the padding's entries, in the order debugfs removes them:
// each directory's files, then it ("DIR/"), then .pad itself.
func padPaths(n int) []string {
	if n <= 0 {
		return nil
	}
	var out []string
	for d := 0; d*padPerDir < n; d++ {
		dir := fmt.Sprintf("%s/%04x", padDir, d)
		for i := d * padPerDir; i < min(n, (d+1)*padPerDir); i++ {
			out = append(out, fmt.Sprintf("%s/%x", dir, i))
		}
		out = append(out, dir+"/")
	}
	return append(out, padDir+"/")
}

// warrenEntries appends Warren's own entries to the flattened tree:
// /.warren/image.json (0444, root's) and the inode padding.
func warrenEntries(tw *tar.Writer, cfgJSON []byte, pad int) error {
	epoch := time.Unix(0, 0)
	hdr := func(typ byte, name string, mode, size int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: typ, Name: name, Mode: mode, Size: size, ModTime: epoch, AccessTime: epoch, ChangeTime: epoch, Format: tar.FormatPAX})
	}
	if err := hdr(tar.TypeDir, flatten.Reserved+"/", 0o755, 0); err != nil {
		return err
	}
	name := strings.TrimPrefix(imageconfig.Path, "/")
	if err := hdr(tar.TypeReg, name, 0o444, int64(len(cfgJSON))); err != nil {
		return err
	}
	if _, err := tw.Write(cfgJSON); err != nil {
		return err
	}
	if pad == 0 {
		return nil
	}
	if err := hdr(tar.TypeDir, padDir+"/", 0o700, 0); err != nil {
		return err
	}
	for d := 0; d*padPerDir < pad; d++ {
		dir := fmt.Sprintf("%s/%04x", padDir, d)
		if err := hdr(tar.TypeDir, dir+"/", 0o700, 0); err != nil {
			return err
		}
		for i := d * padPerDir; i < min(pad, (d+1)*padPerDir); i++ {
			if err := hdr(tar.TypeReg, fmt.Sprintf("%s/%x", dir, i), 0o600, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeCompact streams pass 2 of tree, then extra, through tar2ext4 into
// a new file at img. tar2ext4 runs on a goroutine of its own; the tree is
// written (and report called, with the file bytes written, every 8 MiB)
// on the caller's.
func writeCompact(tree *flatten.Tree, open flatten.LayerOpener, extra func(*tar.Writer) error, img string, disk int64, report func(int64)) error {
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := tar2ext4.ConvertTarToExt4(pr, f, tar2ext4.MaximumDiskSize(disk))
		if err != nil {
			pr.CloseWithError(fmt.Errorf("ext4 writer: %w", err))
		} else {
			pr.CloseWithError(errors.New("ext4 writer: done before the end of the tree"))
		}
		done <- err
	}()
	bw := bufio.NewWriterSize(pw, 1<<20)
	tw := tar.NewWriter(bw)
	var last int64
	_, werr := tree.WriteTo(tw, open, func(n int64) {
		if n-last >= 8<<20 {
			last = n
			report(n)
		}
	})
	if werr == nil {
		werr = extra(tw)
	}
	if werr == nil {
		werr = tw.Close()
	}
	if werr == nil {
		werr = bw.Flush()
	}
	pw.CloseWithError(werr)
	cerr := <-done
	switch {
	case cerr != nil:
		if strings.Contains(cerr.Error(), "disk exceeded maximum size") {
			return fmt.Errorf("the image does not fit in a disk of %d bytes: %w", disk, cerr)
		}
		if werr != nil && !strings.Contains(werr.Error(), "ext4 writer") {
			return werr
		}
		return fmt.Errorf("ext4: %w", cerr)
	case werr != nil:
		return werr
	}
	return nil
}
