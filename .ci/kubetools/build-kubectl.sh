#!/usr/bin/env bash
# make kubetools, second part: kubectl, which the README's fleet test
# (hostd/daemon/readme_fleet_e2e_test.go) runs as the README shows it,
# built from source with the Go module proxy:
#
#   kubectl   k8s.io/kubernetes v1.34.4, package cmd/kubectl (kubectl/go.mod)
#
#   .ci/kubetools/build-kubectl.sh [OUT]    (default build/kubetools)
#
# A script of its own, with a cache entry of its own, so that adding
# kubectl left build.sh's key (and its 13 to 25 minute kube-apiserver
# entry) alone. The binary is static (CGO_ENABLED=0) and cached outside
# the clone under ${WARREN_CACHE:-~/.cache/warren}/kubectl/<key>/bin,
# <key> a hash of `go version`, this script and kubectl/'s go.mod, go.sum
# and Go files. A separate directory from build.sh's kubetools/, whose
# pruning keeps only its own two newest entries. A build is made in a
# temporary directory of the cache and renamed into place complete, under
# the cache's lock; leftovers of killed builds are removed by the next one.
# OUT/kubectl becomes a hard link to the cached binary (a copy where the
# cache is on another file system), put in place by a rename, so it is
# never missing or half written and OUT's other binaries are untouched.
# Run it after build.sh: build.sh replaces OUT whole when its own entry
# changes (`make kubetools` runs both, in that order). The script prints
# OUT's absolute path as its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${1:-build/kubetools}
HERE=.ci/kubetools
GO=${GO:-go}
K8S_VERSION=v1.34.4

log() { printf '[kubectl %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

shopt -s nullglob # the module has no .go file of its own
key=$( {
	"$GO" version
	echo "--- build-kubectl.sh"
	cat "$HERE/build-kubectl.sh"
	for f in "$HERE"/kubectl/go.mod "$HERE"/kubectl/go.sum "$HERE"/kubectl/*.go; do
		echo "--- $f"
		cat "$f"
	done
} | sha256sum | cut -c1-16)
[[ ${#key} -eq 16 ]] || { log "could not compute the cache key"; exit 1; }
CACHE=${WARREN_CACHE:-$HOME/.cache/warren}/kubectl
dest=$CACHE/$key

# link points OUT/kubectl at the cache entry's binary: a hard link made
# beside it and renamed over it, unless it is that file already.
link() {
	if [[ ! $OUT/kubectl -ef $dest/bin/kubectl ]]; then
		mkdir -p "$OUT"
		rm -f "$OUT/.kubectl.tmp"
		ln "$dest/bin/kubectl" "$OUT/.kubectl.tmp" 2>/dev/null || cp -a "$dest/bin/kubectl" "$OUT/.kubectl.tmp"
		mv -T "$OUT/.kubectl.tmp" "$OUT/kubectl"
	fi
	touch "$dest" # most recently used
	log "$OUT/kubectl from $dest/bin (key $key)"
	if [[ -f $dest/times ]]; then log "built in: $(tr '\n' ' ' <"$dest/times")"; fi
	realpath "$OUT"
}

if [[ -x $dest/bin/kubectl ]]; then
	link
	exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
	log "another build holds $CACHE/.lock; waiting"
	flock 9
fi
if [[ -x $dest/bin/kubectl ]]; then # built meanwhile
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
log "cache miss: key $key; building kubectl with $("$GO" version | cut -d' ' -f3) (about 3 minutes on 2 cores from an empty Go build cache, .ci/kubetools/README.md)"

# As build.sh builds kube-apiserver: -trimpath, no VCS stamp, no symbol
# tables, and the release stamped (`kubectl version --client`).
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
t0=$SECONDS
log "building kubectl (k8s.io/kubernetes/cmd/kubectl)"
(cd "$HERE/kubectl" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
	"$GO" build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp/entry/bin/kubectl" k8s.io/kubernetes/cmd/kubectl)
echo "kubectl $((SECONDS - t0))s" >"$tmp/entry/times"
log "built kubectl in $((SECONDS - t0)) s ($(du -m "$tmp/entry/bin/kubectl" | cut -f1) MB)"

"$tmp/entry/bin/kubectl" version --client >&2
sync -f "$tmp/entry/bin/kubectl"
mv -T "$tmp/entry" "$dest"
touch "$dest"
sync -f "$CACHE"
# Keep the two most recently used entries (about 60 MB each); a clone's
# OUT keeps its own hard link to a removed one.
ls -1dt "$CACHE"/*/ 2>/dev/null | tail -n +3 | while read -r old; do
	log "removing the old entry $old"
	rm -rf "$old"
done
link
