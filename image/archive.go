package image

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Bounds on a docker-archive, checked before go-containerregistry reads it.
const (
	// MaxArchiveEntries bounds the entries of a docker-archive tar.
	MaxArchiveEntries = 1 << 16
	// maxArchiveImages bounds the images in its manifest.json.
	maxArchiveImages = 1024
	// maxArchiveLinks bounds symlink hops when resolving a name in it.
	maxArchiveLinks = 8
)

// DefaultArchiveTag is the tag WriteArchive gives an image when none is
// asked for.
const DefaultArchiveTag = "warren/image:latest"

// WriteArchive writes img as a docker-archive tar stream (docker save's
// format, compressed layers) to w, tagged tag ("" for DefaultArchiveTag):
// what `warren templates create --image` uploads, and Open reads back as
// "docker-archive:FILE".
func WriteArchive(w io.Writer, img v1.Image, tag string) error {
	if tag == "" {
		tag = DefaultArchiveTag
	}
	t, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("archive tag %q: %w", tag, err)
	}
	return tarball.Write(t, img, w)
}

// Pack writes img into the OCI layout directory layoutDir (made if
// absent), tagged tag (the org.opencontainers.image.ref.name annotation),
// replacing an image of that tag. It is not atomic: `make rootfs` packs
// into a fresh directory and renames it into place.
func Pack(img v1.Image, layoutDir, tag string) error {
	if tag == "" || strings.ContainsAny(tag, ":/") {
		return fmt.Errorf("pack: tag %q: want a non-empty tag without ':' or '/'", tag)
	}
	p, err := layout.FromPath(layoutDir)
	if err != nil {
		if p, err = layout.Write(layoutDir, empty.Index); err != nil {
			return fmt.Errorf("pack: %w", err)
		}
	}
	plat := Platform
	if err := p.ReplaceImage(img, match.Annotation(RefNameAnnotation, tag),
		layout.WithAnnotations(map[string]string{RefNameAnnotation: tag}), layout.WithPlatform(plat)); err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	return nil
}

// archiveEntry is what the pre-scan keeps of a docker-archive's entry.
type archiveEntry struct {
	typ  byte
	size int64
	link string
}

// openArchive opens "FILE[:REF]" after checking the archive's structure
// with bounds: go-containerregistry reads manifest.json and the config
// whole, and follows links inside the tar.
func openArchive(spec string) (v1.Image, error) {
	file, ref := spec, ""
	if fi, err := os.Stat(spec); err != nil || !fi.Mode().IsRegular() {
		for i := 0; i < len(spec); i++ {
			if spec[i] != ':' {
				continue
			}
			if fi, err := os.Stat(spec[:i]); err == nil && fi.Mode().IsRegular() {
				file, ref = spec[:i], spec[i+1:]
				break
			}
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", file)
	}
	if err := scanArchive(f, ref); err != nil {
		return nil, fmt.Errorf("docker-archive %s: %w", file, err)
	}
	var tag *name.Tag
	if ref != "" {
		t, err := name.NewTag(ref)
		if err != nil {
			return nil, fmt.Errorf("docker-archive tag %q: %w", ref, err)
		}
		tag = &t
	}
	return tarball.ImageFromPath(file, tag)
}

// scanArchive reads a docker-archive's headers (and its manifest.json,
// bounded) and checks that the image ref names (or the only one) has a
// config of at most MaxConfigBytes and layers that are regular files.
func scanArchive(r io.Reader, ref string) error {
	entries := map[string]archiveEntry{}
	var manifest []byte
	tr := tar.NewReader(bufio.NewReader(r))
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if n >= MaxArchiveEntries {
			return fmt.Errorf("more than %d entries", MaxArchiveEntries)
		}
		// go-containerregistry reads the first entry of a name: so
		// does this check.
		p := path.Clean(h.Name)
		if _, dup := entries[p]; dup {
			continue
		}
		entries[p] = archiveEntry{typ: h.Typeflag, size: h.Size, link: h.Linkname}
		if p == "manifest.json" {
			if h.Typeflag != tar.TypeReg {
				return fmt.Errorf("manifest.json is of tar type %q, not a file", h.Typeflag)
			}
			if h.Size > MaxManifestBytes {
				return fmt.Errorf("manifest.json of %d bytes, more than %d", h.Size, MaxManifestBytes)
			}
			if manifest, err = io.ReadAll(tr); err != nil {
				return err
			}
		}
	}
	if manifest == nil {
		return errors.New("no manifest.json (not a docker-archive)")
	}
	d, err := parseArchiveManifest(manifest, ref)
	if err != nil {
		return err
	}
	cfg, err := resolveArchive(entries, d.Config)
	if err != nil {
		return fmt.Errorf("config %q: %w", d.Config, err)
	}
	if cfg.size > MaxConfigBytes {
		return fmt.Errorf("config of %d bytes, more than %d", cfg.size, MaxConfigBytes)
	}
	if len(d.Layers) > MaxLayers {
		return fmt.Errorf("%d layers, more than %d", len(d.Layers), MaxLayers)
	}
	for _, l := range d.Layers {
		if _, err := resolveArchive(entries, l); err != nil {
			return fmt.Errorf("layer %q: %w", l, err)
		}
	}
	return nil
}

// parseArchiveManifest parses manifest.json (bounded) and picks the image
// ref names, or the only one.
func parseArchiveManifest(b []byte, ref string) (*tarball.Descriptor, error) {
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest.json of %d bytes, more than %d", len(b), MaxManifestBytes)
	}
	var m tarball.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest.json: %w", err)
	}
	if len(m) > maxArchiveImages {
		return nil, fmt.Errorf("manifest.json lists %d images, more than %d", len(m), maxArchiveImages)
	}
	if ref == "" {
		if len(m) != 1 {
			return nil, fmt.Errorf("the archive holds %d images: name one with docker-archive:FILE:REF", len(m))
		}
		return &m[0], nil
	}
	want, err := name.NewTag(ref)
	if err != nil {
		return nil, fmt.Errorf("archive tag %q: %w", ref, err)
	}
	for i := range m {
		for _, t := range m[i].RepoTags {
			if got, err := name.NewTag(t); err == nil && got.Name() == want.Name() {
				return &m[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no image tagged %q in the archive", ref)
}

// resolveArchive finds a regular file of the archive by name, following
// links as go-containerregistry does (relative to the link's directory).
func resolveArchive(entries map[string]archiveEntry, p string) (archiveEntry, error) {
	p = path.Clean(p)
	for range maxArchiveLinks {
		e, ok := entries[p]
		if !ok {
			return e, errors.New("not in the archive")
		}
		switch e.typ {
		case tar.TypeReg:
			return e, nil
		case tar.TypeSymlink, tar.TypeLink:
			p = path.Join(path.Dir(p), path.Clean(e.link))
		default:
			return e, fmt.Errorf("tar entry type %q, not a file", e.typ)
		}
	}
	return archiveEntry{}, fmt.Errorf("more than %d links", maxArchiveLinks)
}
