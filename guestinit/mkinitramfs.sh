#!/usr/bin/env bash
# mkinitramfs.sh OUT — build the guest initramfs (a newc cpio) at OUT.
#
# Run from the repository root. Needs Go (the version in go.mod) and access
# to the Go module proxy on first use; nothing else (no git clone, no root,
# no cpio tool).
#
# Contents: one u-root busybox binary (bbin/bb) holding our PID 1
# (guestinit/cmd/warren-init, linked as /init) and a few u-root commands for
# debugging (gosh as /bin/sh, ls, cat, mount, dmesg, ps) and wget for
# network tests, plus memtouch (guestinit/cmd/memtouch, the snapshot
# benchmark's guest program), on top of a tiny base archive with
# dev/console, proc, sys and tmp.
#
# Cached: the archive is kept under
# ${WARREN_CACHE:-$HOME/.cache/warren}/initramfs/<key>/, the key a hash of
# this script, the Go version and target, go.mod and go.sum (which pin
# u-root and every module), and the source files of every package of this
# module the commands link; a later build with the same inputs copies it
# (a few ms instead of 30-50 s). WARREN_INITRAMFS_NOCACHE=1 builds anyway.
#
# Reproducible: two builds from the same tree with the same Go version give
# byte-identical output. u-root zeroes mtimes, inodes and owners of every
# record, builds with -trimpath and strips symbols and build IDs; the u-root
# version comes from go.mod (whose go.sum pins every module), and the base
# archive below is written byte by byte.
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: guestinit/mkinitramfs.sh OUT   (run from the repository root)" >&2
	exit 2
fi
out=$1
if [[ ! -f go.mod || ! -d guestinit/cmd/warren-init ]]; then
	echo "mkinitramfs.sh: run from the repository root" >&2
	exit 2
fi

GO=${GO:-go}
# Commands built into the busybox binary besides our init.
UROOT_CMDS=(gosh ls cat mount dmesg ps wget sync shutdown dd sleep true false kill mkdir rm date)

log() { echo "mkinitramfs: $*" >&2; }
start=$(date +%s%N)

# The same u-root version builds the archive and provides the commands:
# the one go.mod requires (added with go get -tool ...cmds/core/<cmd>).
uroot_version=$("$GO" list -m -f '{{.Version}}' github.com/u-root/u-root)
tooldir=$PWD/build/tools/u-root-$uroot_version
uroot=$tooldir/u-root
if [[ ! -x $uroot ]]; then
	log "installing u-root $uroot_version into $tooldir"
	mkdir -p "$tooldir"
	GOBIN=$tooldir GOFLAGS=-buildvcs=false "$GO" install "github.com/u-root/u-root@$uroot_version"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# newc_record NAME MODE [RDEVMAJOR RDEVMINOR]: one empty cpio "newc" record.
newc_record() {
	local name=$1 mode=$2 rmaj=${3:-0} rmin=${4:-0}
	local namesize=$((${#name} + 1))
	# magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
	# rdevmajor, rdevminor, namesize, check
	printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
		0 "$mode" 0 0 1 0 0 0 0 "$rmaj" "$rmin" "$namesize" 0
	printf '%s\0' "$name"
	# Header (110 bytes) plus name padded to a multiple of 4.
	local pad=$(((4 - (110 + namesize) % 4) % 4))
	head -c "$pad" /dev/zero
}

own=(./guestinit/cmd/warren-init ./guestinit/cmd/memtouch ./guestinit/cmd/hostiledev)
pkgs=("${own[@]}")
for c in "${UROOT_CMDS[@]}"; do
	pkgs+=("github.com/u-root/u-root/cmds/core/$c")
done

# The cache key: everything the bytes of the archive depend on.
key=$({
	echo "--- mkinitramfs.sh"; cat "${BASH_SOURCE[0]}"
	echo "--- go"; "$GO" version; "$GO" env GOOS GOARCH GOAMD64
	echo "--- go.mod"; cat go.mod
	echo "--- go.sum"; cat go.sum
	echo "--- packages: ${pkgs[*]}"
	# The module's own packages the commands link, file by file (tests
	# and testdata aside: they never reach the binary).
	"$GO" list -deps -tags goshsmall -f '{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}' "${own[@]}" |
		while read -r dir; do
			find "$dir" -maxdepth 1 -type f ! -name '*_test.go' -print | LC_ALL=C sort
		done | while read -r f; do
			echo "--- ${f#"$PWD"/}"; cat "$f"
		done
} | sha256sum | cut -c1-16)
[[ ${#key} -eq 16 ]] || { log "could not compute the cache key"; exit 1; }
cache=${WARREN_CACHE:-$HOME/.cache/warren}/initramfs
entry=$cache/$key
mkdir -p "$(dirname "$out")"
if [[ -s $entry/initramfs.cpio && -z ${WARREN_INITRAMFS_NOCACHE:-} ]]; then
	# A copy, not a link: whatever rewrites $out must not reach the cache.
	cp -f "$entry/initramfs.cpio" "$out.tmp" && mv -f "$out.tmp" "$out"
	touch "$entry" # most recently used: kept by the pruning below
	log "cache hit: $entry ($(stat -c %s "$out") bytes, sha256 $(sha256sum "$out" | cut -d' ' -f1))"
	exit 0
fi
log "cache miss: key $key; building"

# Base archive: the console node lets the kernel open /dev/console for PID 1
# before /dev is mounted (so even early errors reach the console); the
# directories save PID 1 a few (emulated, slow) system calls.
log "writing base archive (dev/console, proc, sys, tmp)"
{
	newc_record dev $((8#040755))
	newc_record dev/console $((8#020600)) 5 1
	newc_record proc $((8#040555))
	newc_record sys $((8#040555))
	newc_record tmp $((8#041777))
	newc_record 'TRAILER!!!' 0
} >"$work/base.cpio"

log "building busybox initramfs with u-root $uroot_version: ${pkgs[*]}"
# GOFLAGS is set explicitly so a developer's go env cannot change the bytes.
# u-root warns that it recommends Go 1.20-1.22; it builds fine with newer Go,
# so that warning is filtered out of its log (on stderr).
{
	GOFLAGS=-buildvcs=false "$uroot" \
		-build=bb \
		-base="$work/base.cpio" \
		-initcmd=warren-init \
		-defaultsh=gosh \
		-go-build-tags=goshsmall \
		-tmp-dir="$work" \
		-o "$out" \
		"${pkgs[@]}" 2>&1 >&3 |
		sed -e '/recommended Go versions/,/golang.org\/dl\/go1/d' >&2
} 3>&1

# Publish into the cache atomically: a whole entry or none.
mkdir -p "$cache"
stage=$(mktemp -d "$cache/.new-$key.XXXXXX")
cp "$out" "$stage/initramfs.cpio"
if ! mv -T "$stage" "$entry" 2>/dev/null; then
	rm -rf "$stage" # another build published the same key first
fi
# Keep the 8 most recently used entries (each about 8 MB).
ls -1dt "$cache"/*/ 2>/dev/null | tail -n +9 | xargs -r rm -rf

ms=$((($(date +%s%N) - start) / 1000000))
log "wrote $out: $(stat -c %s "$out") bytes, sha256 $(sha256sum "$out" | cut -d' ' -f1), $((ms / 1000)).$((ms % 1000 / 100)) s"
