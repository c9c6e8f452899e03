#!/usr/bin/env bash
# run.sh - run a command inside an L1 Linux guest that has a real /dev/kvm,
# on a host that has none. See .ci/kvmhost/README.md.
#
# usage: run.sh [--mem MiB] [--cpus N] [--timeout SECONDS] [--idle-timeout SECONDS] [--frozen-timeout SECONDS] [--env NAME=VALUE]... [--host-root] DIR -- CMD...
#
# Boots Debian 12's own kernel under QEMU TCG (software emulation, which
# implements AMD SVM for its guest), loads kvm + kvm_amd there, mounts DIR
# read-write over virtio-9p at the same absolute path, and runs CMD (joined
# with spaces and run by sh -c, like ssh does) with that as its working
# directory. CMD's stdout and stderr (merged) stream to our stdout; we exit
# with CMD's exit status.
#
# Exit status: CMD's, or 124 on timeout, or 125 when the harness itself
# failed (no /dev/kvm in L1, DIR not mounted, QEMU died, ...).
#
# --idle-timeout N: also stop L1 (exit 124) when CMD has printed nothing for
# N seconds: L1's stalls under TCG are silent (README.md). 0, the default,
# never does.
#
# --frozen-timeout N: L1 writes a heartbeat to a second serial port every 5 s
# while CMD runs; stop L1 (exit 124) when neither the heartbeat nor CMD's
# output has come for N seconds. Unlike --idle-timeout this tells a frozen
# L1 (both vCPUs stuck, the stalls in README.md) from a command that is only
# quiet, so N can be short. 0, the default, never does.
#
# --host-root: run CMD chrooted into the host's own root file system (shared
# read-only over 9p), so host tools (qemu, ip, mkfs, go) are there; L1's
# /dev, /proc, /sys and fresh /tmp, /run are mounted into it, DIR read-write.
#
# Environment:
#   WARREN_CACHE                 cache root (default $HOME/.cache/warren);
#                                L1 images live in $WARREN_CACHE/kvmhost/
#   WARREN_KVMHOST_CPU           QEMU -cpu model (default below)
#   WARREN_KVMHOST_KVM_AMD_PARAMS, WARREN_KVMHOST_KVM_PARAMS
#                                insmod parameters for kvm_amd, kvm
#   WARREN_KVMHOST_CPUS          L1 vCPUs when --cpus is not given (default 2)
#   WARREN_KVMHOST_ACCEL         QEMU -accel (default tcg,thread=multi)
#   WARREN_KVMHOST_QEMU_ARGS     extra QEMU arguments (word-split)
#   WARREN_KVMHOST_QEMU          the QEMU binary (default: QEMU 10.0 from
#                                bookworm-backports, cached; see below)
#   WARREN_KVMHOST_KERNEL_PKG    pin the Debian kernel package
#                                (e.g. linux-image-6.1.0-57-amd64)
#   WARREN_KVMHOST_KERNEL_SUITE  bookworm (default) or bookworm-backports:
#                                where L1's kernel comes from
#   WARREN_KVMHOST_DEBUG=1       show the L1 kernel log and trace its init
set -euo pipefail

readonly HARNESS_FAIL=125
SELF=$(readlink -f "${BASH_SOURCE[0]}")
readonly SELF

MEM=4096
CPUS=${WARREN_KVMHOST_CPUS:-2}
TIMEOUT=3600
IDLE_TIMEOUT=0
FROZEN_TIMEOUT=0
ENVS=()
HOST_ROOT=0
# -xsave: L2 guests use FXSAVE. With XSAVE offered, QEMU 7.2's TCG let an
# L2 guest's XSETBV past L1's KVM (every guest warned "XSAVE consistency
# problem"), and under QEMU 10 (no warning) fork children triple-faulted or
# lost their agent in 3 of 3 runs of cmd/warren/cli's fork tests, against 0
# of 3 without XSAVE (README.md, "QEMU 10 for L1").
CPU_MODEL=${WARREN_KVMHOST_CPU:-max,-la57,-xsave}
ACCEL=${WARREN_KVMHOST_ACCEL:-tcg,thread=multi}
# vls=0: no virtual VMLOAD/VMSAVE. With it (kvm_amd's default where the CPU
# offers it, as TCG's "max" does) L1 crashed with a zero GS base in its
# page-fault handler (gs:current_task read as 0, a stack overflow of page
# faults), froze, or a VMM died of a bad FS base, in 3 of 3 runs of
# hostd/daemon's TestE2EKill9; with vls=0, none in its runs (README.md).
KVM_AMD_PARAMS=${WARREN_KVMHOST_KVM_AMD_PARAMS-vls=0}
DEBUG=${WARREN_KVMHOST_DEBUG:-0}

log() { printf 'kvmhost: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit "$HARNESS_FAIL"
}
usage() {
	[[ $# -eq 0 ]] || log "error: $*"
	sed -n 's/^# usage: /usage: /p' "$SELF" >&2
	exit 2
}

while [[ $# -gt 0 ]]; do
	case $1 in
	--mem) MEM=${2:?}; shift 2 ;;
	--cpus) CPUS=${2:?}; shift 2 ;;
	--timeout) TIMEOUT=${2:?}; shift 2 ;;
	--idle-timeout) IDLE_TIMEOUT=${2:?}; shift 2 ;;
	--frozen-timeout) FROZEN_TIMEOUT=${2:?}; shift 2 ;;
	--host-root) HOST_ROOT=1; shift ;;
	--env)
		[[ ${2:-} == [A-Za-z_]*=* ]] || usage "--env wants NAME=VALUE, got '${2:-}'"
		ENVS+=("$2"); shift 2 ;;
	-h | --help) usage ;;
	--) usage "missing DIR before --" ;;
	-*) usage "unknown option $1" ;;
	*) break ;;
	esac
done
[[ $# -ge 3 && $2 == -- ]] || usage "want DIR -- CMD..."
DIR=$(readlink -f "$1") || die "bad DIR '$1'"
[[ -d $DIR ]] || die "DIR '$1' is not a directory"
shift 2
CMD="$*"
[[ $MEM =~ ^[0-9]+$ && $CPUS =~ ^[0-9]+$ && $TIMEOUT =~ ^[0-9]+$ && $IDLE_TIMEOUT =~ ^[0-9]+$ && $FROZEN_TIMEOUT =~ ^[0-9]+$ ]] ||
	usage "--mem, --cpus, --timeout, --idle-timeout and --frozen-timeout take plain integers"

# ---------------------------------------------------------------- host tools
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
command -v cpio >/dev/null || need_pkgs+=(cpio)
command -v modinfo >/dev/null || [[ -x /usr/sbin/modinfo ]] || need_pkgs+=(kmod)
command -v flock >/dev/null || need_pkgs+=(util-linux)
command -v gzip >/dev/null || need_pkgs+=(gzip)
apt_updated=0
apt_update() {
	if [[ $apt_updated == 0 ]]; then
		log "apt-get update"
		apt-get update -qq >&2 || log "warning: apt-get update failed"
		apt_updated=1
	fi
}
if [[ ${#need_pkgs[@]} -gt 0 ]]; then
	[[ $(id -u) == 0 ]] || die "missing ${need_pkgs[*]} and not root to install them"
	apt_update
	log "installing ${need_pkgs[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		"${need_pkgs[@]}" >&2 || die "apt-get install ${need_pkgs[*]} failed"
fi
MODINFO=$(command -v modinfo || echo /usr/sbin/modinfo)

# ------------------------------------------------------------- L1 image cache
CACHE_ROOT=${WARREN_CACHE:-${HOME:-/root}/.cache/warren}/kvmhost
mkdir -p "$CACHE_ROOT"

# ------------------------------------------------------------ QEMU for L1
# L1 runs under QEMU 10.0 from Debian's bookworm-backports, unpacked into
# the cache (not installed: the host's QEMU 7.2 stays the benchmarks'
# peer). Its TCG runs the nested host without the stalls and L2 faults of
# 7.2's (README.md, "QEMU 10 for L1": measured). WARREN_KVMHOST_QEMU picks
# another binary (qemu-system-x86_64 for the host's own).
QEMU_BPO_VERSION=1:10.0.2+ds-2+deb13u1~bpo12+1
# bpo_apt CMD ARGS...: apt-get or apt-cache CMD with a private source list
# for bookworm-backports (the host's apt configuration is left alone),
# whose index lives in the cache and is fetched when missing or a day old.
BPO_APT=$CACHE_ROOT/bpo-apt
bpo_apt() {
	local tool=$1
	shift
	local o=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$BPO_APT/sources" -o "Dir::State::Lists=$BPO_APT/lists")
	(
		flock 8
		if [[ -z $(find "$BPO_APT/lists" -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null) ]]; then
			mkdir -p "$BPO_APT/sources" "$BPO_APT/lists/partial"
			printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
				>"$BPO_APT/sources/bpo.sources"
			log "apt-get update (bookworm-backports, private list)"
			apt-get "${o[@]}" update -qq >&2 || exit 1
		fi
	) 8>"$CACHE_ROOT/bpo-apt.lock" || return 1
	"$tool" "${o[@]}" "$@"
}
qemu_bpo() {
	local dir=$CACHE_ROOT/qemu-${QEMU_BPO_VERSION//[:~+]/_}
	if [[ ! -x $dir/root/usr/bin/qemu-system-x86_64 ]]; then
		(
			flock 9
			[[ -x $dir/root/usr/bin/qemu-system-x86_64 ]] && exit 0
			log "fetching QEMU $QEMU_BPO_VERSION from bookworm-backports for L1 (once)"
			local tmp
			tmp=$(mktemp -d "$CACHE_ROOT/qemu-tmp.XXXXXX")
			mkdir -p "$tmp/debs" "$tmp/root"
			(cd "$tmp/debs" && bpo_apt apt-get download -qq "qemu-system-x86=$QEMU_BPO_VERSION" \
				"qemu-system-common=$QEMU_BPO_VERSION" "qemu-system-data=$QEMU_BPO_VERSION" >&2) || exit 1
			for d in "$tmp"/debs/*.deb; do dpkg-deb -x "$d" "$tmp/root" || exit 1; done
			rm -rf "$dir"
			mv "$tmp" "$dir"
		) 9>"$CACHE_ROOT/qemu.lock" || return 1
	fi
	echo "$dir/root"
}
QEMU_BIN=${WARREN_KVMHOST_QEMU:-}
QEMU_DATA_ARGS=()
if [[ -z $QEMU_BIN ]]; then
	if root=$(qemu_bpo) && "$root/usr/bin/qemu-system-x86_64" --version >/dev/null 2>&1; then
		QEMU_BIN=$root/usr/bin/qemu-system-x86_64
		# Its own option ROMs first, then the host's SeaBIOS (bookworm's).
		QEMU_DATA_ARGS=(-L "$root/usr/share/qemu" -L /usr/share/seabios)
	else
		log "warning: no QEMU $QEMU_BPO_VERSION (bookworm-backports unreachable?): L1 runs under the host's $(qemu-system-x86_64 --version | head -1)"
		QEMU_BIN=qemu-system-x86_64
	fi
fi
SCRIPT_HASH=$(sha256sum "$SELF" | cut -c1-12)

# resolve_kernel prints "PACKAGE VERSION" for the Debian kernel image to use:
# bookworm's linux-image-amd64, or bookworm-backports' with
# WARREN_KVMHOST_KERNEL_SUITE=bookworm-backports.
kapt() {
	if [[ ${WARREN_KVMHOST_KERNEL_SUITE:-bookworm} == bookworm-backports ]]; then
		bpo_apt "$@"
	else
		"$@"
	fi
}
resolve_kernel() {
	local pkg=${WARREN_KVMHOST_KERNEL_PKG:-} meta ver dep
	if [[ -n $pkg ]]; then
		ver=$(kapt apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
		[[ -n $ver && $ver != "(none)" ]] || return 1
		echo "$pkg $ver"
		return
	fi
	meta=linux-image-amd64
	ver=$(kapt apt-cache policy "$meta" 2>/dev/null | awk '/Candidate:/ {print $2}')
	[[ -n $ver && $ver != "(none)" ]] || return 1
	dep=$(kapt apt-cache show "$meta=$ver" 2>/dev/null |
		sed -n 's/^Depends:.*\(linux-image-[0-9][^ ,]*-amd64\).*/\1/p' | head -n1)
	[[ -n $dep ]] || return 1
	echo "$dep $ver"
}

img_for() { echo "$CACHE_ROOT/${KPKG}_${KVER//:/_}-$SCRIPT_HASH"; }
IMG=
if kinfo=$(resolve_kernel); then
	read -r KPKG KVER <<<"$kinfo"
	IMG=$(img_for)
fi
if [[ -z $IMG || ! -f $IMG/initrd.gz ]]; then
	# Cache miss: refresh the package index first, so that we resolve (and
	# download) a kernel version the mirror still serves.
	apt_update
	if kinfo=$(resolve_kernel); then
		read -r KPKG KVER <<<"$kinfo"
		IMG=$(img_for)
	else
		# No package index (offline?): any image built by this script will do.
		# shellcheck disable=SC2012
		IMG=$(ls -dt "$CACHE_ROOT"/linux-image-*-"$SCRIPT_HASH" 2>/dev/null | head -n1)
		[[ -n $IMG && -f $IMG/initrd.gz ]] ||
			die "cannot resolve a Debian kernel package (linux-image-amd64) and no cached L1 image"
		log "package index unavailable; using cached $IMG"
	fi
fi

build_image() {
	local out=$1 work root mods kdir kernel_rel
	work=$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")
	# shellcheck disable=SC2064
	trap "rm -rf '$work'" RETURN
	log "building L1 image $(basename "$out") (once)"
	(cd "$work" && apt-get download -qq busybox-static 2>&1 |
		grep -v 'unsandboxed' >&2; exit "${PIPESTATUS[0]}") ||
		die "apt-get download busybox-static failed"
	(cd "$work" && kapt apt-get download -qq "$KPKG=$KVER" 2>&1 |
		grep -v 'unsandboxed' >&2; exit "${PIPESTATUS[0]}") ||
		die "apt-get download $KPKG=$KVER failed"
	mkdir "$work/x" "$work/bb"
	# Only the kernel and the module trees that can hold what L1 needs
	# (skipping the ~300 MB of drivers/gpu, drivers/net, sound, ...).
	dpkg-deb --fsys-tarfile "$work/$KPKG"_*.deb | tar -x -C "$work/x" --wildcards \
		'./boot/vmlinuz-*' './lib/modules/*/kernel/arch/*' './lib/modules/*/kernel/virt/*' \
		'./lib/modules/*/kernel/drivers/virtio/*' './lib/modules/*/kernel/drivers/crypto/*' \
		'./lib/modules/*/kernel/net/*' './lib/modules/*/kernel/fs/*' \
		'./lib/modules/*/kernel/lib/*' './lib/modules/*/kernel/crypto/*' \
		'./lib/modules/*/kernel/drivers/net/tun.ko*' './lib/modules/*/kernel/drivers/net/veth.ko*' \
		'./lib/modules/*/kernel/drivers/vhost/*' './lib/modules/*/modules.builtin' ||
		die "extracting $KPKG failed"
	dpkg-deb -x "$work"/busybox-static_*.deb "$work/bb"
	kdir=$(find "$work/x/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)
	kernel_rel=$(basename "$kdir")

	root=$work/root
	mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,mnt,lib/modules,warren}
	cp "$work/bb/bin/busybox" "$root/bin/busybox"
	local app
	for app in $("$root/bin/busybox" --list); do
		[[ $app == busybox ]] || ln -sf busybox "$root/bin/$app"
	done
	# e2fsprogs, from the host (with the shared libraries they load): the
	# daemon makes an image template's ext4 root file system with
	# e2fsck, tune2fs and resize2fs (package image), and tests read
	# images with debugfs, inside L1.
	local tool lib f
	for tool in e2fsck tune2fs resize2fs debugfs dumpe2fs mke2fs; do
		f=$(PATH=/usr/sbin:/sbin:$PATH command -v "$tool") || die "$tool not found (install e2fsprogs)"
		cp "$f" "$root/sbin/$tool"
		for lib in $(ldd "$f" | grep -o '/[^ ]*'); do
			mkdir -p "$root$(dirname "$lib")"
			cp -n "$lib" "$root$lib"
		done
	done
	printf 'root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
	echo "127.0.0.1 localhost" >"$root/etc/hosts"

	# Modules, with their dependencies, in load order (no modules.dep in the
	# package: that is made by depmod at install time, so resolve via modinfo).
	declare -A path_of=() done_mod=()
	local f name
	while IFS= read -r f; do
		name=${f##*/}
		name=${name%%.ko*}
		path_of[${name//-/_}]=$f
	done < <(find "$kdir/kernel" -name '*.ko*')
	mods=()
	add_mod() {
		local m=${1//-/_} d
		[[ -n ${done_mod[$m]:-} ]] && return
		done_mod[$m]=1
		if [[ -z ${path_of[$m]:-} ]]; then
			# Built into this kernel (virtio_pci is, in 6.12's).
			grep -q "/${m}.ko\$" "$kdir/modules.builtin" 2>/dev/null && return
			grep -q "/${m//_/-}.ko\$" "$kdir/modules.builtin" 2>/dev/null && return
			die "module $m not in $KPKG"
		fi
		for d in $("$MODINFO" -F depends "${path_of[$m]}" | tr ',' ' '); do
			add_mod "$d"
		done
		mods+=("$m")
	}
	# tun and bridge: the VMM's taps and the benchmarks' host-side network;
	# veth: the fleet e2e's hosts, each in a network namespace of its own;
	# vhost_vsock: QEMU's vsock, the peer of Warren's in bench/agent;
	# sch_ingress and cls_bpf: the egress filter's clsact attachment (no tcx
	# before Linux 6.6).
	for name in kvm_amd virtio_pci 9pnet_virtio 9p tun veth bridge vhost_vsock sch_ingress cls_bpf; do add_mod "$name"; done
	: >"$root/lib/modules/order"
	for name in "${mods[@]}"; do
		f=${path_of[$name]}
		case $f in
		*.ko) cp "$f" "$root/lib/modules/$name.ko" ;;
		*.ko.xz) xz -dc "$f" >"$root/lib/modules/$name.ko" ;;
		*.ko.zst) zstd -qdc "$f" >"$root/lib/modules/$name.ko" ;;
		*.ko.gz) gzip -dc "$f" >"$root/lib/modules/$name.ko" ;;
		*) die "unknown module format $f" ;;
		esac
		echo "$name" >>"$root/lib/modules/order"
	done
	echo "$KPKG $KVER $kernel_rel" >"$root/etc/kvmhost-release"

	write_init >"$root/init"
	chmod 755 "$root/init"
	(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) |
		gzip -6 >"$work/initrd.gz"
	mkdir "$work/img"
	# QEMU boots the uncompressed ELF vmlinux through its PVH entry point
	# (CONFIG_PVH), which skips the bzImage's real-mode setup and, above
	# all, the xz decompression: that alone takes seconds under TCG.
	if ! extract_vmlinux "$work"/x/boot/vmlinuz-* "$work/img/vmlinux"; then
		log "warning: could not extract vmlinux; booting the bzImage"
		cp "$work"/x/boot/vmlinuz-* "$work/img/vmlinuz"
	fi
	mv "$work/initrd.gz" "$work/img/initrd.gz"
	echo "$KPKG $KVER $kernel_rel modules: ${mods[*]}" >"$work/img/INFO"
	rm -rf "$out"
	mv "$work/img" "$out"
}

# extract_vmlinux BZIMAGE OUT: the ELF kernel inside a bzImage (the
# approach of the kernel's scripts/extract-vmlinux).
extract_vmlinux() {
	local img=$1 out=$2 magic tool pos
	for magic in $'\xfd7zXZ:xz -dc' $'\x28\xb5\x2f\xfd:zstd -qdc' $'\x1f\x8b\x08:gzip -dc'; do
		tool=${magic#*:}
		command -v "${tool%% *}" >/dev/null || continue
		for pos in $(LC_ALL=C grep -abo "${magic%%:*}" "$img" | cut -d: -f1 | head -n5); do
			tail -c +$((pos + 1)) "$img" | $tool >"$out" 2>/dev/null || true
			[[ $(head -c4 "$out" 2>/dev/null) == $'\x7fELF' ]] && return 0
		done
	done
	rm -f "$out"
	return 1
}

# write_init prints L1's /init. Per-run settings come from /warren/config,
# which each run appends to the initramfs as a second cpio archive.
write_init() {
	cat <<'EOF'
#!/bin/sh
export PATH=/bin:/sbin
mount -t devtmpfs dev /dev
exec </dev/null >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t tmpfs run /run
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t devpts devpts /dev/pts
# cgroup v2, as on the hosts users run: the daemon's tests place VMMs in
# cgroups of their own (hostd/cgroup) when the hierarchy is there.
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
. /warren/config
[ "$DEBUG" = 1 ] && set -x
ifconfig lo 127.0.0.1 up 2>/dev/null
hostname kvmhost

finish() {
	echo "WARREN-KVMHOST-EXIT-$NONCE=$1"
	sync
	poweroff -f
	sleep 10
}
fail() {
	echo "kvmhost(L1): $*"
	dmesg | grep -iE 'kvm|svm|9p|virtio' | tail -n 40
	finish 125
}

for m in $(cat /lib/modules/order); do
	params=
	case $m in
	kvm_amd) params=$KVM_AMD_PARAMS ;;
	kvm) params=$KVM_PARAMS ;;
	esac
	# shellcheck disable=SC2086
	insmod /lib/modules/$m.ko $params || fail "insmod $m $params failed"
done
[ -c /dev/kvm ] || fail "/dev/kvm did not appear"

mkdir -p "$MOUNTPOINT"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=mmap,access=any work "$MOUNTPOINT" ||
	fail "mounting the work dir over 9p failed"
cd "$MOUNTPOINT" || fail "cd $MOUNTPOINT failed"

export HOME=/tmp TMPDIR=/tmp USER=root LOGNAME=root
export WARREN_KVMHOST=1 WARREN_KVMHOST_DIR="$MOUNTPOINT"
[ -f /warren/env ] && . /warren/env
[ "$DEBUG" = 1 ] || dmesg -n 1
set +x
if [ "$HEARTBEAT" = 1 ]; then
	# The host watches ttyS1 (a file) grow: it stops only if L1 freezes.
	(while :; do echo . >/dev/ttyS1; sleep 5; done) </dev/null >/dev/null 2>&1 &
fi
echo "WARREN-KVMHOST-READY-$NONCE $(cut -d' ' -f1 /proc/uptime)"
if [ "$HOST_ROOT" = 1 ]; then
	# Run CMD in the host's own userland (read-only over 9p), with L1's
	# /dev, /proc, /sys, fresh /tmp and /run, and DIR read-write.
	mkdir -p /host
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro hostroot /host ||
		fail "mounting the host root over 9p failed"
	for d in dev proc sys; do mount -o bind /$d /host/$d || fail "bind /$d"; done
	mount -t cgroup2 cgroup2 /host/sys/fs/cgroup 2>/dev/null
	mount -o bind /dev/pts /host/dev/pts
	mount -t tmpfs -o mode=1777 tmp /host/tmp
	mount -t tmpfs run /host/run
	# DIR under /tmp or /run (a git worktree, a CI clone) lies in the fresh
	# tmpfs just mounted there: make its mount point first.
	[ -d "/host$MOUNTPOINT" ] || mkdir -p "/host$MOUNTPOINT"
	mount -o bind "$MOUNTPOINT" "/host$MOUNTPOINT" || fail "bind $MOUNTPOINT into the host root"
	cp /warren/cmd /host/tmp/.kvmhost-cmd
	[ -f /warren/env ] && cp /warren/env /host/tmp/.kvmhost-env
	chroot /host /bin/sh -c "cd '$MOUNTPOINT' && export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin && { [ -f /tmp/.kvmhost-env ] && . /tmp/.kvmhost-env; true; } && sh /tmp/.kvmhost-cmd"
	finish $?
fi
sh /warren/cmd
finish $?
EOF
}

if [[ ! -f $IMG/initrd.gz ]]; then
	exec 9>"$CACHE_ROOT/.lock"
	flock 9
	[[ -f $IMG/initrd.gz ]] || build_image "$IMG"
	# Prune images of older kernels or older versions of this script that
	# no run has used for a day.
	find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -name 'linux-image-*' -mmin +1440 \
		! -path "$IMG" -exec rm -rf {} +
	flock -u 9
	exec 9>&-
fi
touch "$IMG"

# ---------------------------------------------------------------------- run
TMP=$(mktemp -d)
QPID=
# shellcheck disable=SC2317 # invoked by trap
cleanup() {
	if [[ -n $QPID ]]; then kill "$QPID" 2>/dev/null || true; fi
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

NONCE=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
mkdir -p "$TMP/r/warren"
{
	echo "NONCE=$NONCE"
	echo "MOUNTPOINT=$(q "$DIR")"
	echo "KVM_AMD_PARAMS=$(q "$KVM_AMD_PARAMS")"
	echo "KVM_PARAMS=$(q "${WARREN_KVMHOST_KVM_PARAMS:-}")"
	echo "DEBUG=$(q "$DEBUG")"
	echo "HOST_ROOT=$HOST_ROOT"
	echo "HEARTBEAT=$((FROZEN_TIMEOUT > 0 ? 1 : 0))"
} >"$TMP/r/warren/config"
printf '%s\n' "$CMD" >"$TMP/r/warren/cmd"
if [[ ${#ENVS[@]} -gt 0 ]]; then
	for e in "${ENVS[@]}"; do
		echo "export ${e%%=*}=$(q "${e#*=}")"
	done >"$TMP/r/warren/env"
fi
(cd "$TMP/r" && find warren | cpio -o -H newc --quiet -R 0:0) | gzip >"$TMP/run.gz"
cat "$IMG/initrd.gz" "$TMP/run.gz" >"$TMP/initrd"

KERNEL=$IMG/vmlinux
[[ -f $KERNEL ]] || KERNEL=$IMG/vmlinuz
append="console=ttyS0 panic=-1 rdinit=/init mitigations=off nokaslr"
# L1's full boot log goes to the console (kept aside by the reader below
# unless something fails); init turns the console log level down before CMD.
append+=" loglevel=7"

# shellcheck disable=SC2054 # commas are QEMU's
qemu=("$QEMU_BIN" "${QEMU_DATA_ARGS[@]}"
	-accel "$ACCEL" -cpu "$CPU_MODEL" -smp "$CPUS" -m "$MEM"
	-nodefaults -no-user-config -nographic -no-reboot
	-serial stdio -monitor none
	-kernel "$KERNEL" -initrd "$TMP/initrd" -append "$append"
	-virtfs "local,path=$DIR,mount_tag=work,security_model=none,id=work"
)
if ((FROZEN_TIMEOUT > 0)); then
	: >"$TMP/alive"
	qemu+=(-serial "file:$TMP/alive") # L1's ttyS1: the heartbeat
fi
if [[ $HOST_ROOT == 1 ]]; then
	qemu+=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,id=hostroot")
fi
# shellcheck disable=SC2206
qemu+=(${WARREN_KVMHOST_QEMU_ARGS:-})

T0=${EPOCHREALTIME/[.,]/}
elapsed() {
	local us=$((${EPOCHREALTIME/[.,]/} - T0))
	printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10))
}
log "booting L1 ($(cut -d' ' -f1,2 "$IMG/INFO"), $("$QEMU_BIN" --version | head -1 | sed 's/ (.*//'), -accel $ACCEL -cpu $CPU_MODEL, ${CPUS} vCPUs, ${MEM} MiB, timeout ${TIMEOUT}s)"

rc_file=$TMP/rc
ready_file=$TMP/ready
boot_log=$TMP/boot.log
show_boot_log() {
	if [[ -s $boot_log ]]; then
		log "L1 console before the command started:"
		cat "$boot_log" >&2
	fi
}
mkfifo "$TMP/out"
timeout --foreground -k 10 "$TIMEOUT" "${qemu[@]}" </dev/null >"$TMP/out" 2>"$TMP/qemu.err" &
QPID=$!
handle_line() {
	local line=${1%$'\r'}
	case $line in
	*"WARREN-KVMHOST-EXIT-$NONCE="*)
		# the command's last line may lack a newline: keep what precedes
		pre=${line%%WARREN-KVMHOST-EXIT-"$NONCE"=*}
		[[ -z $pre ]] || printf '%s\n' "$pre"
		echo "${line##*=}" >"$rc_file"
		;;
	*"watchdog: BUG: soft lockup"*)
		# L1 has locked up (seen rarely under TCG; not the command's
		# doing): stop soon rather than at the timeout, as a harness
		# failure, after 5 s more of its console for the stuck CPU's
		# backtrace, which follows this line.
		printf '%s\n' "$line"
		if [[ ! -f $TMP/lockup ]]; then
			log "error: L1 kernel reports a soft lockup; stopping it in 5 s"
			echo "$HARNESS_FAIL" >"$rc_file"
			touch "$TMP/lockup"
			lockup_at=$SECONDS
		fi
		;;
	*"WARREN-KVMHOST-READY-$NONCE"*)
		echo "$(elapsed) ${line##* }" >"$ready_file"
		last_alive=$SECONDS
		log "L1 up after $(elapsed)s (L1 uptime ${line##* }s); running: $CMD"
		;;
	*)
		# Until the command starts, L1's console (firmware, kernel, init)
		# is kept aside and shown only if something goes wrong; so is the
		# power-off chatter after it ended.
		if [[ $DEBUG == 1 || (-f $ready_file && ! -f $rc_file) || -f $TMP/lockup ]]; then
			printf '%s\n' "$line"
		else
			printf '[+%ss] %s\n' "$(elapsed)" "$line" >>"$boot_log"
		fi
		;;
	esac
}
# The console is read in slices of at most 5 s so that a silent L1 can be
# noticed: with --idle-timeout, a command that has printed nothing for that
# long is taken for a frozen L1 (the stalls in README.md are silent) and
# stopped as a timeout (124). A slice that ends mid-line is kept in $partial.
partial=
last_output=$SECONDS
last_alive=$SECONDS alive_size=0 lockup_at=
while :; do
	if [[ -n $lockup_at ]] && ((SECONDS - lockup_at >= 5)); then
		kill "$QPID" 2>/dev/null || true
		lockup_at=
	fi
	chunk=
	st=0
	IFS= read -r -t 5 chunk || st=$?
	if ((st == 0)); then
		handle_line "$partial$chunk"
		partial=
		last_output=$SECONDS last_alive=$SECONDS
		continue
	fi
	if ((st > 128)); then
		if [[ -n $chunk ]]; then
			partial+=$chunk
			last_output=$SECONDS
		fi
		if ((IDLE_TIMEOUT > 0 && SECONDS - last_output >= IDLE_TIMEOUT)) &&
			[[ -f $ready_file && ! -f $rc_file ]]; then
			log "error: the command printed nothing for ${IDLE_TIMEOUT}s: taking L1 for frozen and stopping it"
			touch "$TMP/idle"
			kill "$QPID" 2>/dev/null || true
			last_output=$SECONDS
		fi
		if ((FROZEN_TIMEOUT > 0)) && [[ -f $ready_file && ! -f $rc_file && ! -f $TMP/frozen ]]; then
			size=$(stat -c %s "$TMP/alive" 2>/dev/null || echo 0)
			if [[ $size != "$alive_size" || -n $chunk ]]; then
				alive_size=$size last_alive=$SECONDS
			elif ((SECONDS - last_alive >= FROZEN_TIMEOUT)); then
				log "error: no heartbeat and no output from L1 for ${FROZEN_TIMEOUT}s: L1 is frozen; stopping it"
				touch "$TMP/frozen"
				kill "$QPID" 2>/dev/null || true
			fi
		fi
		continue
	fi
	[[ -z $partial$chunk ]] || handle_line "$partial$chunk"
	break
done <"$TMP/out"
qrc=0
wait "$QPID" || qrc=$?
QPID=

if [[ -f $rc_file ]]; then
	rc=$(cat "$rc_file")
	if [[ $rc == "$HARNESS_FAIL" && ! -f $ready_file ]]; then
		show_boot_log
		log "error: L1 setup failed (see messages above); total $(elapsed)s"
	else
		log "command exited with status $rc; total $(elapsed)s"
	fi
	exit "$rc"
fi
[[ -f $ready_file ]] || show_boot_log
if [[ -f $TMP/idle ]]; then
	log "error: stopped after ${IDLE_TIMEOUT}s without output; total $(elapsed)s"
	exit 124
fi
if [[ -f $TMP/frozen ]]; then
	log "error: stopped a frozen L1 (no heartbeat for ${FROZEN_TIMEOUT}s); total $(elapsed)s"
	exit 124
fi
if [[ $qrc == 124 || $qrc == 137 ]]; then
	log "error: timed out after ${TIMEOUT}s ($( [[ -f $ready_file ]] && echo 'while running the command' || echo 'before L1 was up'))"
	exit 124
fi
[[ -s $TMP/qemu.err ]] && sed 's/^/qemu: /' "$TMP/qemu.err" >&2
log "error: L1 stopped without reporting an exit status (qemu exit $qrc); total $(elapsed)s"
exit "$HARNESS_FAIL"
