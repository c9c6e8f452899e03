package cli

// The daemon verbs on a tenant's templates, image bases, secrets and
// encryption key (rows of daemonVerbs).

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

var listTemplates = listing((*client.Client).Templates, "ID\tSTATUS\tMEM\tCPUS\tKERNEL\tBUILD\tCREATED", func(t client.Template) string {
	return fmt.Sprintf("%s\t%s\t%d\t%d\t%s\t%.0f ms\t%s", t.ID, t.Status, t.MemMiB, t.CPUs, filepath.Base(t.Kernel), t.BuildMS, ago(t.Created))
})

// listImages is `warren images [ls]`: the tenant's image bases (one per
// image digest, shared by its templates).
var listImages = listing((*client.Client).Images, "KEY\tREF\tLAYERS\tCONTENT\tDISK\tTEMPLATES", func(i client.Image) string {
	return fmt.Sprintf("%s\t%s\t%d\t%.0f MiB\t%.0f MiB\t%s", i.Key, orDash(i.Ref), i.Layers, float64(i.ContentBytes)/(1<<20),
		float64(i.DiskBytes)/(1<<20), orDash(strings.Join(i.Templates, ",")))
})

const templatesCreateUsage = "templates create {--kernel K [--initramfs I] | --image REF | --rootfs DIR|FILE.tar} [--disk D]... [--mem MiB] [--cpus N] [--cmdline S] [--network] [--balloon]\n" +
	"    [--disk-mib N] [--insecure-registry] [--start-cmd CMD | --start-image-cmd] [--ready-cmd CMD] [--ready-timeout D]"

// templatesCreate is `warren templates create`: a local image (--image
// oci-layout:DIR or docker-archive:FILE, --rootfs) is read here and
// uploaded (client.ImageRef).
func templatesCreate(d *daemonCmd) func() int {
	kernel := d.fs.String("kernel", "", "guest kernel: the name of a vmlinux or bzImage in the daemon's guest directory (warren-hostd --guest-dir; required without --image/--rootfs, whose default is the daemon's)")
	imageRef := d.fs.String("image", "", "make the root file system from an image: a registry reference (pulled by the daemon), oci-layout:DIR[:TAG] or docker-archive:FILE.tar (read here and uploaded)")
	rootfs := d.fs.String("rootfs", "", "make the root file system from a plain tree: a directory or a tar file (read here and uploaded)")
	insecure := d.fs.Bool("insecure-registry", false, "pull --image over plain HTTP (a registry the daemon's operator allows, e.g. on loopback)")
	diskMiB := d.fs.Int("disk-mib", 0, "size of the image's root file system in MiB (sparse; default the daemon's, 4096)")
	startCmd := d.fs.String("start-cmd", "", "a shell command started (and kept running) in the template before its snapshot, so it runs in every sandbox")
	startImage := d.fs.Bool("start-image-cmd", false, "run the image's own Entrypoint and Cmd as the start command")
	readyCmd := d.fs.String("ready-cmd", "", "a shell command run until it exits 0 before the snapshot (with a start command)")
	readyTimeout := d.fs.Duration("ready-timeout", 0, "how long --ready-cmd may take (default 2m)")
	initramfs := d.fs.String("initramfs", "", "initramfs (cpio): a name in the daemon's guest directory")
	var disks stringsFlag
	d.fs.Var(&disks, "disk", "a raw disk image of the daemon's guest directory, NAME[,ro]: copied into the template; ,ro shared read-only by every sandbox, else each sandbox writes to a copy-on-write overlay of its own (repeatable)")
	mem := d.fs.Int("mem", 0, "guest memory in MiB (daemon default 256)")
	cpus := d.fs.Int("cpus", 0, "vCPUs (daemon default 1)")
	cmdline := d.fs.String("cmdline", "", "extra kernel command-line arguments")
	network := d.fs.Bool("network", false, "give the template's sandboxes a private network with filtered egress (deny all until a sandbox's --egress policy)")
	balloon := d.fs.Bool("balloon", false, "give the template's sandboxes a memory balloon with free page reporting (warren balloon --target sets how much of the guest's memory it takes)")
	return func() int {
		if (*kernel == "" && *imageRef == "" && *rootfs == "") || (*imageRef != "" && *rootfs != "") {
			return d.usageErr()
		}
		// Names of files in the daemon's guest directory, sent as they
		// are: the daemon never opens a host path a client names.
		req := wire.TemplateRequest{Kernel: *kernel, Initramfs: *initramfs, Disks: disks, MemMiB: *mem, CPUs: *cpus, Cmdline: *cmdline, Network: *network, Balloon: *balloon}
		req.DiskMiB, req.InsecureRegistry, req.StartCmd, req.StartImageCmd, req.ReadyCmd = *diskMiB, *insecure, *startCmd, *startImage, *readyCmd
		req.ReadyTimeoutS = int(readyTimeout.Seconds())
		fn := d.progress("template")
		var t *client.Template
		var err error
		if req.Image, err = d.c.ImageRef(d.ctx, *imageRef, *rootfs, fn); err == nil {
			t, err = d.c.CreateTemplate(d.ctx, req, fn)
		}
		return show(d, t, err, func(t *client.Template) { fmt.Fprintln(d.stdout, t.ID) })
	}
}

// listSecrets is `warren secrets [ls]`: the names of the tenant's secrets.
func listSecrets(d *daemonCmd) func() int {
	return func() int {
		l, err := d.c.Secrets(d.ctx)
		return show(d, wire.SecretList{Names: l}, err, func(l wire.SecretList) {
			for _, n := range l.Names {
				fmt.Fprintln(d.stdout, n)
			}
		})
	}
}

// setSecret is `warren secrets set NAME [FILE|-]`: the value is
// client.ReadSecret's, never from the command line.
func setSecret(d *daemonCmd) func() int {
	return func() int {
		v, err := client.ReadSecret(d.fs.Arg(1), d.stdin)
		if err != nil {
			return d.fail(err)
		}
		if err := d.c.SetSecret(d.ctx, d.fs.Arg(0), bytes.NewReader(v)); err != nil {
			return d.fail(err)
		}
		fmt.Fprintln(d.stdout, d.fs.Arg(0))
		return 0
	}
}

// showKey is `warren keys show` and `keys create` (sub, whose call get is).
func showKey(sub string, get func(*client.Client, context.Context) (wire.KeyInfo, error)) func(d *daemonCmd) func() int {
	return func(d *daemonCmd) func() int {
		return func() int {
			k, err := get(d.c, d.ctx)
			return show(d, k, err, func(k wire.KeyInfo) {
				switch {
				case k.Revoked && sub == "revoke":
					fmt.Fprintf(d.stdout, "revoked; sandboxes stopped: %d %s\n", len(k.Stopped), strings.Join(k.Stopped, " "))
				case k.Revoked:
					fmt.Fprintln(d.stdout, "revoked")
				default:
					fmt.Fprintln(d.stdout, k.KeyID)
				}
			})
		}
	}
}

const keysRevokeUsage = "keys revoke --yes\n\nRevoking crypto-shreds the tenant's key: its running sandboxes are stopped, and its\n" +
	"snapshots and disks can never be read again."

// revokeKey is `warren keys revoke --yes`.
func revokeKey(d *daemonCmd) func() int {
	yes := d.fs.Bool("yes", false, "confirm: the tenant's snapshots and disks become unreadable for good")
	run := showKey("revoke", (*client.Client).RevokeKey)(d)
	return func() int {
		if !*yes {
			fmt.Fprintln(d.stderr, "warren keys revoke: the tenant's snapshots and disks would become unreadable for good; add --yes")
			return 2
		}
		return run()
	}
}
