#!/usr/bin/env bash
# Build Warren's guest kernel (vmlinux + bzImage) from Debian's linux-source-6.1.
#
#   kernel/build.sh OUTDIR
#
# Result: OUTDIR/vmlinux, OUTDIR/bzImage, OUTDIR/kernel.config, OUTDIR/System.map
#
# Recipe: make tinyconfig, merge kernel/warren.config on top, verify that every
# option of the fragment survived, apply kernel/pvm-native.patch, build.
# Results are cached under ${WARREN_CACHE:-$HOME/.cache/warren}/kernel/<key>/,
# where <key> hashes the exact linux-source-6.1 package version, warren.config,
# pvm-native.patch and this script. See kernel/README.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FRAGMENT="$HERE/warren.config"
PATCH="$HERE/pvm-native.patch"
SRC_PKG=linux-source-6.1
SRC_TARBALL=/usr/src/linux-source-6.1.tar.xz
ARCH=x86_64
export ARCH

log() { printf '[kernel %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[kernel] ERROR: %s\n' "$*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
OUTDIR="$1"
[ -f "$FRAGMENT" ] || die "missing $FRAGMENT"
[ -f "$PATCH" ] || die "missing $PATCH"

# --- 1. Host packages -------------------------------------------------------
# Install only what is missing; apt-get update only when something must be
# installed. Needs root for that (a prepared host needs nothing).
NEEDED_PKGS=(linux-source-6.1 build-essential flex bison bc libelf-dev libssl-dev
             cpio xz-utils gzip patch util-linux)
missing=()
for p in "${NEEDED_PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing missing packages: ${missing[*]}"
	if [ "$(id -u)" -ne 0 ]; then
		die "missing packages (${missing[*]}); run as root or: apt-get install ${missing[*]}"
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	apt-get install -y --no-install-recommends "${missing[@]}"
fi
[ -f "$SRC_TARBALL" ] || die "$SRC_TARBALL not found (package $SRC_PKG installed?)"

# --- 2. Cache key ------------------------------------------------------------
SRC_VERSION="$(dpkg-query -W -f='${Version}' "$SRC_PKG")"
KEY="$( {
	echo "pkg $SRC_PKG $SRC_VERSION"
	echo "--- warren.config";    cat "$FRAGMENT"
	echo "--- pvm-native.patch"; cat "$PATCH"
	echo "--- build.sh";         cat "${BASH_SOURCE[0]}"
} | sha256sum | cut -c1-16)"
CACHE_ROOT="${WARREN_CACHE:-$HOME/.cache/warren}/kernel"
ENTRY="$CACHE_ROOT/$KEY"
ARTIFACTS=(vmlinux bzImage config System.map)
mkdir -p "$CACHE_ROOT"

entry_complete() {
	local f
	for f in "${ARTIFACTS[@]}"; do [ -s "$ENTRY/$f" ] || return 1; done
}

publish() {
	mkdir -p "$OUTDIR"
	# Copies, not hard links: a tool that strips or rewrites OUTDIR/vmlinux
	# must not be able to corrupt the cache entry.
	cp -f "$ENTRY/vmlinux"    "$OUTDIR/vmlinux"
	cp -f "$ENTRY/bzImage"    "$OUTDIR/bzImage"
	cp -f "$ENTRY/config"     "$OUTDIR/kernel.config"
	cp -f "$ENTRY/System.map" "$OUTDIR/System.map"
	log "done: $OUTDIR/vmlinux $OUTDIR/bzImage $OUTDIR/kernel.config (cache key $KEY)"
}

if entry_complete; then
	log "cache hit: $ENTRY ($SRC_PKG $SRC_VERSION)"
	publish
	exit 0
fi

# One build at a time per cache (they share the work tree).
exec 9>"$CACHE_ROOT/.lock"
if ! flock -n 9; then
	log "another kernel build holds $CACHE_ROOT/.lock; waiting"
	flock 9
fi
if entry_complete; then   # built by whoever held the lock
	log "cache hit after wait: $ENTRY"
	publish
	exit 0
fi

log "cache miss: key $KEY ($SRC_PKG $SRC_VERSION); building"
T0=$SECONDS

# --- 3. Source tree: extracted + patched, reused across config changes -------
# Keyed by package version and patch, so an edit of warren.config or build.sh
# rebuilds incrementally in the same object directory.
SRC_KEY="$( { echo "$SRC_VERSION"; cat "$PATCH"; } | sha256sum | cut -c1-16)"
WORK="$CACHE_ROOT/work/$SRC_KEY"
SRC="$WORK/src"
OBJ="$WORK/obj"
if [ ! -f "$SRC/Makefile" ]; then
	log "stage: extract $SRC_TARBALL"
	rm -rf "$WORK"
	mkdir -p "$WORK"
	tmp="$WORK/src.tmp"
	mkdir -p "$tmp"
	tar -C "$tmp" -xf "$SRC_TARBALL"
	[ -d "$tmp/linux-source-6.1" ] || die "unexpected tarball layout in $SRC_TARBALL"
	log "stage: apply $(basename "$PATCH")"
	patch -p1 --forward --batch -d "$tmp/linux-source-6.1" < "$PATCH" >/dev/null \
		|| die "pvm-native.patch does not apply to $SRC_PKG $SRC_VERSION"
	mv "$tmp/linux-source-6.1" "$SRC"
	rmdir "$tmp"
fi
mkdir -p "$OBJ"

# Reproducible-ish version string (no user/host/date of the builder).
export KBUILD_BUILD_USER=warren KBUILD_BUILD_HOST=warren
# The timestamp must be a date (gen_initramfs.sh feeds it to date -d): use
# the source tarball's, so it only changes with the package.
export KBUILD_BUILD_TIMESTAMP="$(date -u -r "$SRC_TARBALL" '+%Y-%m-%d %H:%M:%S UTC')"
export KBUILD_BUILD_VERSION=1
MAKE=(make -C "$SRC" O="$OBJ" ARCH="$ARCH")

# --- 4. Configuration ---------------------------------------------------------
log "stage: tinyconfig + warren.config (the first run compiles kconfig: HOSTCC lines)"
# (kconfig's "override: X changes choice state" notes are expected: the
# fragment deliberately overrides tinyconfig's choices.)
{
	"${MAKE[@]}" tinyconfig | grep -E '^  HOST(CC|LD) ' || true
	(cd "$SRC" && scripts/kconfig/merge_config.sh -m -O "$OBJ" "$OBJ/.config" "$FRAGMENT") >/dev/null
	"${MAKE[@]}" -s olddefconfig >/dev/null
} 2> >(grep -v 'changes choice state' >&2)

log "stage: verify config"
bad=0
while IFS= read -r line; do
	if [[ "$line" =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
		opt="${BASH_REMATCH[1]}"; want="${BASH_REMATCH[2]}"
		got="$(grep -E "^${opt}=" "$OBJ/.config" | head -n1 | cut -d= -f2- || true)"
		if [ "$got" != "$want" ]; then
			printf '[kernel] config: %s=%s requested by warren.config, final .config has %s\n' \
				"$opt" "$want" "${got:-it unset}" >&2
			bad=1
		fi
	elif [[ "$line" =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
		opt="${BASH_REMATCH[1]}"
		if grep -qE "^${opt}=" "$OBJ/.config"; then
			printf '[kernel] config: %s must be unset (warren.config), final .config has %s\n' \
				"$opt" "$(grep -E "^${opt}=" "$OBJ/.config")" >&2
			bad=1
		fi
	fi
done < "$FRAGMENT"
[ "$bad" -eq 0 ] || die "final .config does not match warren.config (missing dependencies?)"

# --- 5. Build -------------------------------------------------------------------
JOBS="$(nproc)"
log "stage: build vmlinux + bzImage (make -j$JOBS; first build takes several minutes)"
"${MAKE[@]}" -j"$JOBS" vmlinux bzImage

# --- 6. Publish into the cache atomically ------------------------------------------
log "stage: store in cache"
stage="$(mktemp -d "$CACHE_ROOT/.tmp-$KEY.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
cp "$OBJ/vmlinux"                 "$stage/vmlinux"
cp "$OBJ/arch/x86/boot/bzImage"   "$stage/bzImage"
cp "$OBJ/.config"                 "$stage/config"
cp "$OBJ/System.map"              "$stage/System.map"
rm -rf "$ENTRY"                   # an incomplete entry (cannot be, but be safe)
mv "$stage" "$ENTRY"
log "built in $((SECONDS - T0)) s"
publish
