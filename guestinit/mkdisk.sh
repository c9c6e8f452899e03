#!/usr/bin/env bash
# mkdisk.sh OUT SIZE_MiB [DIR]
#
# Makes OUT, a raw ext4 image of SIZE_MiB MiB (sparse), for a Warren data
# disk: the guest sees it as /dev/vda and warren-init mounts it at
# /mnt/data. With DIR, the image holds a copy of DIR's tree (mkfs.ext4 -d).
#
# Reproducible: the same SIZE_MiB and the same DIR contents (names, bytes,
# modes, symlinks) give a byte-identical image, whoever builds it and
# whenever. To that end the script
#   - replaces any existing OUT rather than formatting over old bytes;
#   - uses its own mke2fs.conf (MKE2FS_CONFIG), not the host's defaults;
#   - fixes the file system UUID and directory hash seed (WARREN_DISK_UUID,
#     default below);
#   - fixes every timestamp mke2fs writes (E2FSPROGS_FAKE_TIME) to
#     SOURCE_DATE_EPOCH (default 2024-01-01T00:00:00Z);
#   - makes root own everything (-E root_owner=0:0 for the root directory,
#     then debugfs for the copied files) and sets every copied inode's
#     atime, mtime, ctime and crtime to SOURCE_DATE_EPOCH.
# Not normalised: the order in which mkfs.ext4 reads DIR (readdir order)
# decides inode numbers, so copies of DIR on different host file systems may
# still differ. File names containing '"', '\' or a newline are refused.
#
# Needs e2fsprogs (mkfs.ext4 and debugfs, >= 1.43 for -d): apt-get install e2fsprogs.
set -euo pipefail

die() { echo "mkdisk.sh: $*" >&2; exit 1; }

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
	die "usage: mkdisk.sh OUT SIZE_MiB [DIR]"
fi
out=$1 size=$2 dir=${3:-}
[[ $size =~ ^[1-9][0-9]*$ ]] || die "SIZE_MiB must be a positive integer, not '$size'"
[ -z "$dir" ] || [ -d "$dir" ] || die "$dir is not a directory"
for tool in mkfs.ext4 debugfs; do
	command -v "$tool" >/dev/null || die "needs $tool: apt-get install e2fsprogs"
done

epoch=${SOURCE_DATE_EPOCH:-1704067200}
uuid=${WARREN_DISK_UUID:-5741a252-0d15-4b00-8000-000000000001}
[[ $epoch =~ ^[1-9][0-9]*$ ]] || die "SOURCE_DATE_EPOCH must be a positive integer"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The features Linux 6.1 (kernel/) mounts read-write; 4 KiB blocks whatever
# the size (usage type "warren", so that mke2fs does not pick small/floppy).
cat >"$tmp/mke2fs.conf" <<'EOF'
[defaults]
	base_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
	enable_periodic_fsck = 0
	blocksize = 4096
	inode_size = 256
	inode_ratio = 16384

[fs_types]
	warren = {
		inode_ratio = 16384
	}
	ext4 = {
		features = has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize
	}
EOF

if [ -n "$dir" ]; then
	# debugfs commands that normalise owners and times of what -d copies
	# (it keeps the host's); checked before anything is written.
	(cd "$dir" && find . -print0) | while IFS= read -r -d '' p; do
		case $p in
		*'"'* | *\\* | *$'\n'*) die "unsupported file name: $p" ;;
		esac
		p=/${p#.}
		p=${p/#\/\//\/}
		printf 'sif "%s" uid 0\nsif "%s" gid 0\n' "$p" "$p"
		for f in atime mtime ctime crtime; do
			printf 'sif "%s" %s @%s\n' "$p" "$f" "$epoch"
		done
	done >"$tmp/cmds"
fi

export MKE2FS_CONFIG="$tmp/mke2fs.conf" E2FSPROGS_FAKE_TIME=$epoch
rm -f "$out"
ok=0
trap 'rm -rf "$tmp"; [ "$ok" = 1 ] || rm -f "$out"' EXIT
truncate -s "${size}M" "$out"
mkfs.ext4 -F -q -T warren -U "$uuid" -E "root_owner=0:0,hash_seed=$uuid" ${dir:+-d "$dir"} "$out"
if [ -n "$dir" ]; then
	debugfs -w -f "$tmp/cmds" "$out" >/dev/null 2>"$tmp/err" || die "debugfs failed: $(cat "$tmp/err")"
	if grep -v '^debugfs [0-9.]* (' "$tmp/err" | grep -q .; then
		die "debugfs: $(grep -v '^debugfs [0-9.]* (' "$tmp/err" | head -5)"
	fi
fi
ok=1
