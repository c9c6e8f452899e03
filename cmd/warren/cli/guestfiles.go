package cli

// The daemon verbs of the file API (warren files ls, stat, mkdir, rm, mv,
// watch: sub-commands of "files", rows of daemonVerbs). Paths are the
// guest's; warren cp copies files in and out.

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/warrenvm/warren/hostd/wire"
)

// filesLsCmd is `warren files ls [-d DEPTH] SANDBOX [PATH]`.
func filesLsCmd(d *daemonCmd) func() int {
	depth := d.fs.Int("d", 1, "how many levels down to list (1: the directory's own entries; at most 32)")
	return func() int {
		p := "/"
		if d.fs.NArg() > 1 {
			p = d.fs.Arg(1)
		}
		l, err := d.c.ListFiles(d.ctx, d.id, p, *depth)
		return show(d, l, err, func(l []wire.FileInfo) {
			tw := tabwriter.NewWriter(d.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
			for _, f := range l {
				fmt.Fprintf(tw, "%s\t%d\t %s\t %s\t\n", f.Mode, f.Size, f.ModTime.Local().Format(time.DateTime), fileName(f))
			}
			tw.Flush()
		})
	}
}

// fileName is a listed file's path (its name when it has none), with a
// link's target.
func fileName(f wire.FileInfo) string {
	n := f.Path
	if n == "" {
		n = f.Name
	}
	if f.Link != "" {
		n += " -> " + f.Link
	}
	return n
}

// filesStatCmd is `warren files stat SANDBOX PATH`.
func filesStatCmd(d *daemonCmd) func() int {
	return func() int {
		fi, err := d.c.StatFile(d.ctx, d.id, d.fs.Arg(1))
		return show(d, fi, err, func(fi *wire.FileInfo) {
			kind := "file"
			switch {
			case fi.IsDir:
				kind = "directory"
			case fi.Mode&fs.ModeSymlink != 0:
				kind = "symbolic link to " + fi.Link
			case !fi.Mode.IsRegular():
				kind = fi.Mode.Type().String()
			}
			fmt.Fprintf(d.stdout, "path:     %s\ntype:     %s\nsize:     %d\nmode:     %s (%04o)\nmodified: %s\n",
				d.fs.Arg(1), kind, fi.Size, fi.Mode, fi.Mode.Perm(), fi.ModTime.Local().Format(time.RFC3339))
		})
	}
}

// filesMkdirCmd is `warren files mkdir [-p] [-m MODE] SANDBOX PATH`.
func filesMkdirCmd(d *daemonCmd) func() int {
	parents := d.fs.Bool("p", false, "create missing parents too; an existing directory is no error")
	mode := d.fs.String("m", "755", "permissions, octal")
	return func() int {
		m, err := strconv.ParseUint(*mode, 8, 32)
		if err != nil || m > 0o777 {
			fmt.Fprintf(d.stderr, "%s: -m %q: want octal permissions\n", d.name, *mode)
			return 2
		}
		fi, err := d.c.Mkdir(d.ctx, d.id, d.fs.Arg(1), fs.FileMode(m), *parents)
		return show(d, fi, err, func(*wire.FileInfo) {})
	}
}

// filesRmCmd is `warren files rm [-r] SANDBOX PATH`.
func filesRmCmd(d *daemonCmd) func() int {
	recursive := d.fs.Bool("r", false, "remove a directory and everything under it")
	return func() int {
		err := d.c.RemoveFile(d.ctx, d.id, d.fs.Arg(1), *recursive)
		return show(d, map[string]string{"deleted": d.fs.Arg(1)}, err, func(map[string]string) {})
	}
}

// filesMvCmd is `warren files mv SANDBOX FROM TO`.
func filesMvCmd(d *daemonCmd) func() int {
	return func() int {
		fi, err := d.c.RenameFile(d.ctx, d.id, d.fs.Arg(1), d.fs.Arg(2))
		return show(d, fi, err, func(*wire.FileInfo) {})
	}
}

// filesWatchCmd is `warren files watch [-r] [--count N] SANDBOX PATH`: a
// line per change (TIME OP PATH) until interrupted, or until N changes.
func filesWatchCmd(d *daemonCmd) func() int {
	recursive := d.fs.Bool("r", false, "watch the directories under it too, new ones included")
	count := d.fs.Int("count", 0, "exit after this many changes (0: never)")
	return func() int {
		n := 0
		enc := json.NewEncoder(d.stdout)
		err := d.c.WatchFiles(d.ctx, d.id, d.fs.Arg(1), *recursive, func(ev wire.WatchEvent) bool {
			if *d.asJSON {
				enc.Encode(ev)
			} else if ev.Op == "ready" {
				fmt.Fprintf(d.stderr, "%s: watching %s\n", d.name, ev.Path)
			} else {
				fmt.Fprintf(d.stdout, "%s %-8s %s\n", ev.Time.Local().Format("15:04:05.000"), ev.Op, ev.Path)
			}
			if ev.Op != "ready" {
				n++
			}
			return *count == 0 || n < *count
		})
		if err != nil && d.ctx.Err() == nil {
			return d.fail(err)
		}
		return 0
	}
}
