// Package image turns an OCI or Docker image into a read-only ext4 root
// file system (a "base") for Warren's guests, without mounting anything
// and without unpacking the image onto the host's file system.
//
//   - Open resolves a reference (a registry, "oci-layout:DIR[:TAG]",
//     "docker-archive:FILE[:REF]") to a linux/amd64 image; FromRootfs makes
//     one from a plain tree or tar.
//   - Store.Build fetches and verifies its layers, flattens them (package
//     image/flatten), writes the ext4 with tar2ext4 and finishes it with
//     e2fsprogs into a normal writable file system of the asked size, with
//     the image's configuration at guestinit/imageconfig.Path; one base
//     per config digest and size, shared by every caller, published
//     atomically.
//   - WriteArchive and Pack write an image as a docker-archive stream or
//     into an OCI layout.
//
// Everything an image brings is untrusted: manifests, configs and archive
// metadata are read with bounds and checked against their digests, blobs
// against their declared sizes and digests, uncompressed layers against a
// total limit and their diff_ids, and tar entries by package flatten's
// rules. See README.md for the design and measured figures.
//
// May import: vmm, devices, cow, memsnap, ebpf, internal, and
// guestinit/imageconfig; not hostd, cmd or bench (internal/layout checks
// it).
package image
