#!/usr/bin/env bash
# make kubetools: the real servers the fleet tests start (fleet/fleettest),
# built from source with the Go module proxy:
#
#   kube-apiserver  k8s.io/kubernetes v1.34.4 (kube-apiserver/go.mod)
#   etcd            go.etcd.io/etcd/server/v3 v3.6.5 (etcd/go.mod)
#   weed            SeaweedFS, its S3 gateway (weed/go.mod)
#
#   .ci/kubetools/build.sh [OUT]    (default build/kubetools)
#
# Each is its own module under .ci/kubetools (a dot directory: the main
# module's ./... never sees them, and their dependencies never meet the
# main module's); a `tool` line in go.mod names the command. The binaries are static (CGO_ENABLED=0), so they run in
# the nested KVM host's busybox userland too. They are cached outside the
# clone under ${WARREN_CACHE:-~/.cache/warren}/kubetools/<key>/bin, <key>
# a hash of `go version`, this script and the three modules' go.mod, go.sum
# and Go files: a machine builds them once (kube-apiserver takes about 13
# minutes on 2 cores, README.md). A build is made in a temporary directory
# of the cache and renamed into place complete, under the cache's lock;
# leftovers of killed builds are removed by the next one. OUT gets hard
# links to the cached binaries (a copy where the cache is on another file
# system), never a symbolic link, so OUT works where only the clone is
# visible (the nested KVM host mounts just the clone). The script prints
# OUT's absolute path as its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${1:-build/kubetools}
HERE=.ci/kubetools
GO=${GO:-go}
TOOLS=(kube-apiserver etcd weed)
K8S_VERSION=v1.34.4

log() { printf '[kubetools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

shopt -s nullglob # a module may have no .go file of its own
key=$( {
	"$GO" version
	echo "--- build.sh"
	cat "$HERE/build.sh"
	for t in "${TOOLS[@]}"; do
		for f in "$HERE/$t"/go.mod "$HERE/$t"/go.sum "$HERE/$t"/*.go; do
			echo "--- $f"
			cat "$f"
		done
	done
} | sha256sum | cut -c1-16)
[[ ${#key} -eq 16 ]] || { log "could not compute the cache key"; exit 1; }
CACHE=${WARREN_CACHE:-$HOME/.cache/warren}/kubetools
dest=$CACHE/$key

complete() {
	local t
	for t in "${TOOLS[@]}"; do [[ -x $dest/bin/$t ]] || return 1; done
}

# link replaces OUT with links to the cache entry's binaries, atomically
# (a rename), unless OUT already holds exactly them.
link() {
	local t same=1
	for t in "${TOOLS[@]}"; do
		[[ $OUT/$t -ef $dest/bin/$t ]] || same=0
	done
	if ((!same)); then
		mkdir -p "$(dirname "$OUT")"
		rm -rf "$OUT.tmp"
		cp -al "$dest/bin" "$OUT.tmp" 2>/dev/null || { rm -rf "$OUT.tmp"; cp -a "$dest/bin" "$OUT.tmp"; }
		rm -rf "$OUT.old"
		if [[ -e $OUT ]]; then mv -T "$OUT" "$OUT.old"; fi
		mv -T "$OUT.tmp" "$OUT"
		rm -rf "$OUT.old"
	fi
	touch "$dest" # most recently used
	log "$OUT: kube-apiserver, etcd and weed from $dest/bin (key $key)"
	if [[ -f $dest/times ]]; then log "built in: $(tr '\n' ' ' <"$dest/times")"; fi
	realpath "$OUT"
}

if complete; then
	link
	exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
	log "another build holds $CACHE/.lock; waiting"
	flock 9
fi
if complete; then # built meanwhile
	link
	exit 0
fi
# Under the lock, any temporary directory is a killed build's.
for stale in "$CACHE"/.tmp-*; do
	[[ -e $stale ]] || continue
	log "removing $stale (an interrupted build)"
	rm -rf "$stale"
done

tmp=$(mktemp -d "$CACHE/.tmp-$key-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
mkdir -p "$tmp/entry/bin"
log "cache miss: key $key; building ${TOOLS[*]} with $("$GO" version | cut -d' ' -f3) (kube-apiserver takes about 13 minutes on 2 cores the first time)"

# -trimpath and no VCS stamp: the same bytes wherever the clone is. -s -w
# leave out the symbol tables. kube-apiserver reports its release (its
# /version), stamped as Kubernetes' own build does.
ldflags_k8s="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
ldflags_k8s+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34"
ldflags_k8s+=" -X k8s.io/component-base/version.gitTreeState=clean"
build() { # build NAME PACKAGE [LDFLAGS]
	local name=$1 pkg=$2 ldflags=${3:--s -w} t0=$SECONDS
	log "building $name ($pkg)"
	(cd "$HERE/$name" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
		"$GO" build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp/entry/bin/$name" "$pkg")
	echo "$name $((SECONDS - t0))s" >>"$tmp/entry/times"
	log "built $name in $((SECONDS - t0)) s ($(du -m "$tmp/entry/bin/$name" | cut -f1) MB)"
}
build etcd .
build weed github.com/seaweedfs/seaweedfs/weed
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$ldflags_k8s"

"$tmp/entry/bin/kube-apiserver" --version >&2
# (Not `| head -1`: head exits after the first line, etcd's next write
# gets SIGPIPE, and pipefail failed the build: make's "Error 141".)
etcd_version=$("$tmp/entry/bin/etcd" --version)
echo "${etcd_version%%$'\n'*}" >&2
"$tmp/entry/bin/weed" version >&2
sync -f "$tmp/entry/bin/kube-apiserver"
mv -T "$tmp/entry" "$dest"
touch "$dest"
sync -f "$CACHE"
# Keep the two most recently used entries (about 250 MB each); a clone's
# OUT keeps its own hard links to a removed one.
ls -1dt "$CACHE"/*/ 2>/dev/null | tail -n +3 | while read -r old; do
	log "removing the old entry $old"
	rm -rf "$old"
done
link
