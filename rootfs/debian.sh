#!/usr/bin/env bash
# make rootfs: a Debian 12 (bookworm) root file system as an OCI image
# layout (tag "bookworm"), for `warren templates create --image
# oci-layout:build/rootfs/debian:bookworm`.
#
# debootstrap (minbase plus the packages below) into a temporary directory,
# cleaned for an image, packed by cmd/warren-rootfs (image.FromRootfs +
# image.Pack) with the image config: Env PATH and LANG=C.UTF-8, WorkingDir
# /root, Cmd ["/bin/bash"]. The result is cached outside the clone, under
# ${WARREN_CACHE:-~/.cache/warren}/rootfs/debian-<hash>/ (the hash is of
# this script, which holds the suite and the package list), and linked at
# OUT (default build/rootfs/debian). A build is made in a temporary
# directory of the cache and renamed into place complete, so an
# interrupted one leaves nothing half-done; leftovers of killed ones are
# removed by the next run (under the cache's lock).
#
# Needs root (debootstrap), debootstrap, and Go; the network reaches
# deb.debian.org (or $DEBIAN_MIRROR).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-build/rootfs/debian}
SUITE=bookworm
PACKAGES=python3,git,curl,ca-certificates,procps,iproute2
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TAG=$SUITE
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

CACHE=${WARREN_CACHE:-$HOME/.cache/warren}/rootfs
hash=$(sha256sum "$0" | cut -c1-16)
dest=$CACHE/debian-$SUITE-$hash

# link puts the cached layout at OUT: hard links where the cache is on the
# same file system (else a copy), never a symbolic link, so that OUT works
# wherever only the repository is visible (the nested KVM host mounts just
# the clone).
link() {
	mkdir -p "$(dirname "$OUT")"
	if [ -f "$OUT/index.json" ] && cmp -s "$OUT/index.json" "$dest/layout/index.json"; then
		echo "make rootfs: $OUT is up to date (oci-layout:$OUT:$TAG)"
		return
	fi
	rm -rf "$OUT" "$OUT.tmp"
	cp -al "$dest/layout" "$OUT.tmp" 2>/dev/null || { rm -rf "$OUT.tmp"; cp -a "$dest/layout" "$OUT.tmp"; }
	mv "$OUT.tmp" "$OUT"
	echo "make rootfs: $OUT from $dest/layout (oci-layout:$OUT:$TAG)"
	if [ -f "$dest/stats.json" ]; then cat "$dest/stats.json"; fi
}

if [ -f "$dest/layout/index.json" ]; then
	link
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "make rootfs: debootstrap needs root (the cache has no $dest yet)" >&2
	exit 1
fi
command -v debootstrap >/dev/null || { echo "make rootfs: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ -f "$dest/layout/index.json" ]; then # built meanwhile
	link
	exit 0
fi
# Under the lock, any temporary directory is a killed build's.
for stale in "$CACHE"/.tmp-*; do
	[ -e "$stale" ] || continue
	echo "make rootfs: removing $stale (an interrupted build)"
	awk -v p="$stale/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r umount -l
	rm -rf --one-file-system "$stale"
done

tmp=$(mktemp -d "$CACHE/.tmp-debian-XXXXXX")
cleanup() {
	# debootstrap mounts /proc and /sys inside the target while it runs.
	awk -v p="$tmp/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r umount -l || true
	rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

root=$tmp/root
t0=$(date +%s.%N)
echo "make rootfs: debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$tmp/debootstrap.log" 2>&1 || {
	tail -30 "$tmp/debootstrap.log" >&2
	exit 1
}
t1=$(date +%s.%N)

# Clean for an image: no package lists or caches, no logs, no host
# identity. /etc/hostname and /etc/resolv.conf are left for the guest's
# PID 1 to write; /etc/hosts names localhost.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
	"$root"/var/cache/apt/archives/partial/* "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old \
	"$root"/tmp/* "$root"/var/tmp/* "$root"/root/.bash_history
find "$root/var/log" -type f -delete
rm -f "$root/etc/hostname" "$root/etc/resolv.conf"
if [ -e "$root/etc/machine-id" ]; then : >"$root/etc/machine-id"; fi
cat >"$root/etc/hosts" <<'EOF'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
ff02::1	ip6-allnodes
ff02::2	ip6-allrouters
EOF
if awk -v p="$root/" 'index($2, p) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
	echo "make rootfs: something is still mounted under $root" >&2
	exit 1
fi
files=$(find "$root" -xdev | wc -l)
tree_bytes=$(du -sb --apparent-size "$root" | cut -f1)

CGO_ENABLED=0 ${GO:-go} build -o "$tmp/warren-rootfs" ./cmd/warren-rootfs
mkdir "$tmp/out"
"$tmp/warren-rootfs" --root "$root" --layout "$tmp/out/layout" --tag "$TAG" \
	--env "PATH=$IMAGE_PATH" --env LANG=C.UTF-8 --workdir /root --cmd '["/bin/bash"]' >"$tmp/pack.json"
t2=$(date +%s.%N)

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
{
	printf '{\n  "suite": "%s",\n  "packages": "%s",\n  "files": %d,\n  "tree_bytes": %d,\n' "$SUITE" "$PACKAGES" "$files" "$tree_bytes"
	printf '  "debootstrap_s": %s,\n  "pack_s": %s,\n  "pack": ' "$(secs "$t0" "$t1")" "$(secs "$t1" "$t2")"
	cat "$tmp/pack.json"
	printf '}\n'
} >"$tmp/out/stats.json"
sync -f "$tmp/out/layout/index.json"
mv -T "$tmp/out" "$dest"
sync -f "$CACHE"
link
