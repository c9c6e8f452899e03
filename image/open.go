package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Source prefixes Open understands besides registry references.
const (
	LayoutPrefix  = "oci-layout:"
	ArchivePrefix = "docker-archive:"
)

// RefNameAnnotation is the OCI annotation that tags an image in a
// layout's index.json (what Pack writes and Open's TAG matches).
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// Platform is the only platform Warren's guests run.
var Platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// OpenOptions tune Open.
type OpenOptions struct {
	// Insecure allows a registry over plain HTTP (name.Insecure).
	Insecure bool
	// Keychain gives registry credentials; nil: authn.DefaultKeychain.
	Keychain authn.Keychain
	// Transport carries registry requests; nil: the default transport.
	Transport http.RoundTripper
}

// Open resolves a reference to an image for linux/amd64:
//
//   - a registry reference ("registry:5000/repo:tag", "repo@sha256:..."),
//     pulled with go-containerregistry's remote package (the manifest and
//     config now, the layers when Store.Build reads them, under ctx);
//   - "oci-layout:DIR[:TAG]": an OCI image layout directory; TAG is matched
//     against the images' org.opencontainers.image.ref.name annotation;
//     without TAG the index must hold exactly one image. When DIR itself
//     exists, the whole string is DIR; otherwise TAG is what follows the
//     last ':' (tags hold no ':' or '/').
//   - "docker-archive:FILE[:REF]": a `docker save` (or WriteArchive) tar;
//     without REF the archive must hold exactly one image. When FILE
//     itself exists the whole string is FILE; otherwise FILE is the
//     shortest prefix before a ':' that is an existing file.
//
// An index (multi-platform image) is resolved to its linux/amd64 image; an
// image whose config names another platform is refused, naming it (an
// image whose config names none is taken for linux/amd64). The manifests,
// the index and the config are read with bounds (MaxManifestBytes,
// MaxConfigBytes) and checked against their digests.
func Open(ctx context.Context, ref string, opts OpenOptions) (v1.Image, error) {
	var (
		img v1.Image
		err error
	)
	switch {
	case strings.HasPrefix(ref, LayoutPrefix):
		img, err = openLayout(strings.TrimPrefix(ref, LayoutPrefix))
	case strings.HasPrefix(ref, ArchivePrefix):
		img, err = openArchive(strings.TrimPrefix(ref, ArchivePrefix))
	default:
		img, err = openRemote(ctx, ref, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	if _, _, err := readConfig(img); err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	return img, nil
}

func openRemote(ctx context.Context, ref string, opts OpenOptions) (v1.Image, error) {
	var nopts []name.Option
	if opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, err
	}
	kc := opts.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithPlatform(Platform)}
	if opts.Transport != nil {
		ropts = append(ropts, remote.WithTransport(opts.Transport))
	}
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return nil, err
	}
	if err := checkDescriptor(desc.Descriptor, desc.Manifest); err != nil {
		return nil, err
	}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, err
		}
		return pickPlatform(idx, remoteBlobs{}, 0)
	}
	if !desc.MediaType.IsImage() {
		return nil, fmt.Errorf("manifest of media type %q: not an image this builder reads", desc.MediaType)
	}
	return desc.Image()
}

// checkDescriptor checks a manifest or index's bytes against its
// descriptor: size bound, size and digest.
func checkDescriptor(d v1.Descriptor, raw []byte) error {
	if d.Size > MaxManifestBytes || int64(len(raw)) > MaxManifestBytes {
		return fmt.Errorf("manifest of %d bytes, more than %d", max(d.Size, int64(len(raw))), MaxManifestBytes)
	}
	if int64(len(raw)) != d.Size {
		return fmt.Errorf("manifest %s is %d bytes, its descriptor says %d", d.Digest, len(raw), d.Size)
	}
	return checkDigest(d.Digest, raw, "manifest")
}

func checkDigest(want v1.Hash, raw []byte, what string) error {
	if want.Algorithm != "sha256" {
		return fmt.Errorf("%s digest %q: only sha256 is supported", what, want)
	}
	sum := sha256.Sum256(raw)
	if got := hex.EncodeToString(sum[:]); got != want.Hex {
		return fmt.Errorf("%s digest mismatch: sha256:%s, expected %s", what, got, want)
	}
	return nil
}

// blobChecker vets a child descriptor of an index before its blob is
// read (a layout's blobs are files read whole).
type blobChecker interface {
	check(d v1.Descriptor) error
}

type remoteBlobs struct{}

func (remoteBlobs) check(d v1.Descriptor) error {
	if d.Size > MaxManifestBytes {
		return fmt.Errorf("manifest %s of %d bytes, more than %d", d.Digest, d.Size, MaxManifestBytes)
	}
	return nil
}

// layoutBlobs checks that a blob file has the size its descriptor says,
// before go-containerregistry reads it whole.
type layoutBlobs struct{ dir string }

func (l layoutBlobs) check(d v1.Descriptor) error {
	if d.Size > MaxManifestBytes {
		return fmt.Errorf("manifest %s of %d bytes, more than %d", d.Digest, d.Size, MaxManifestBytes)
	}
	return l.checkSize(d)
}

func (l layoutBlobs) checkSize(d v1.Descriptor) error {
	if d.Digest.Algorithm != "sha256" || len(d.Digest.Hex) != 64 || strings.ContainsAny(d.Digest.Hex, "/.") {
		return fmt.Errorf("blob digest %q: only sha256 is supported", d.Digest)
	}
	fi, err := os.Stat(filepath.Join(l.dir, "blobs", d.Digest.Algorithm, d.Digest.Hex))
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != d.Size {
		return fmt.Errorf("blob %s is %d bytes, its descriptor says %d", d.Digest, fi.Size(), d.Size)
	}
	return nil
}

// maxIndexDepth bounds indexes nested in indexes.
const maxIndexDepth = 4

// pickPlatform resolves an index to its linux/amd64 image. A child that
// names no platform is taken only when it is the index's only image.
func pickPlatform(idx v1.ImageIndex, blobs blobChecker, depth int) (v1.Image, error) {
	if depth >= maxIndexDepth {
		return nil, fmt.Errorf("indexes nested more than %d deep", maxIndexDepth)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var (
		seen     []string
		noPlat   []v1.Descriptor
		children int
	)
	for _, d := range im.Manifests {
		if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
			continue
		}
		children++
		if d.Platform == nil {
			noPlat = append(noPlat, d)
			continue
		}
		if d.Platform.OS != Platform.OS || d.Platform.Architecture != Platform.Architecture {
			seen = append(seen, d.Platform.String())
			continue
		}
		return childImage(idx, d, blobs, depth)
	}
	if len(noPlat) == 1 && children == 1 {
		return childImage(idx, noPlat[0], blobs, depth)
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("an index with no linux/amd64 image (%d entries, none naming a platform)", children)
	}
	return nil, fmt.Errorf("an index with no linux/amd64 image (it has %s)", strings.Join(seen, ", "))
}

// checkManifest checks that m's manifest is the one d describes (its
// digest and size), for an index or an image alike.
func checkManifest(d v1.Descriptor, m interface{ RawManifest() ([]byte, error) }) error {
	raw, err := m.RawManifest()
	if err != nil {
		return err
	}
	return checkDescriptor(d, raw)
}

func childImage(idx v1.ImageIndex, d v1.Descriptor, blobs blobChecker, depth int) (v1.Image, error) {
	if err := blobs.check(d); err != nil {
		return nil, err
	}
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		if err := checkManifest(d, child); err != nil {
			return nil, err
		}
		return pickPlatform(child, blobs, depth+1)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, err
	}
	if err := checkManifest(d, img); err != nil {
		return nil, err
	}
	if l, ok := blobs.(layoutBlobs); ok {
		// The config is read whole too: check its file first.
		m, err := img.Manifest()
		if err != nil {
			return nil, err
		}
		if m.Config.Size > MaxConfigBytes {
			return nil, fmt.Errorf("config of %d bytes, more than %d", m.Config.Size, MaxConfigBytes)
		}
		if err := l.checkSize(m.Config); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	return img, nil
}

// openLayout opens "DIR[:TAG]".
func openLayout(spec string) (v1.Image, error) {
	dir, tag := spec, ""
	if fi, err := os.Stat(spec); err != nil || !fi.IsDir() {
		if i := strings.LastIndexByte(spec, ':'); i > 0 && !strings.Contains(spec[i+1:], "/") {
			dir, tag = spec[:i], spec[i+1:]
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "index.json"))
	if err != nil {
		return nil, fmt.Errorf("not an OCI layout: %w", err)
	}
	if fi.Size() > MaxManifestBytes {
		return nil, fmt.Errorf("index.json of %d bytes, more than %d", fi.Size(), MaxManifestBytes)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	blobs := layoutBlobs{dir: dir}
	var (
		found []v1.Descriptor
		tags  []string
	)
	for _, d := range im.Manifests {
		t := d.Annotations[RefNameAnnotation]
		tags = append(tags, fmt.Sprintf("%q", t))
		if tag == "" || t == tag {
			found = append(found, d)
		}
	}
	switch {
	case len(found) == 0 && tag != "":
		return nil, fmt.Errorf("no image tagged %q in the layout (tags: %s)", tag, strings.Join(tags, ", "))
	case len(found) == 0:
		return nil, errors.New("the layout's index is empty")
	case len(found) > 1 && tag == "":
		return nil, fmt.Errorf("the layout holds %d images: name one with oci-layout:DIR:TAG (tags: %s)", len(found), strings.Join(tags, ", "))
	case len(found) > 1:
		return nil, fmt.Errorf("%d images tagged %q in the layout", len(found), tag)
	}
	d := found[0]
	switch {
	case d.MediaType.IsIndex():
		if err := blobs.check(d); err != nil {
			return nil, err
		}
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		raw, err := child.RawManifest()
		if err != nil {
			return nil, err
		}
		if err := checkDescriptor(d, raw); err != nil {
			return nil, err
		}
		return pickPlatform(child, blobs, 1)
	case d.MediaType.IsImage():
		return childImage(idx, d, blobs, 0)
	}
	return nil, fmt.Errorf("index entry of media type %q: not an image", d.MediaType)
}

// knownLayer reports whether a layer media type is one Build reads.
func knownLayer(mt types.MediaType) bool {
	switch mt {
	case types.DockerLayer, types.DockerUncompressedLayer, types.DockerForeignLayer,
		types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer,
		types.OCIRestrictedLayer, types.OCIUncompressedRestrictedLayer:
		return true
	}
	return false
}
