package image

import (
	"bytes"
	"fmt"
	"path"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/warrenvm/warren/guestinit/imageconfig"
)

// Bounds on what an image may bring.
const (
	// MaxManifestBytes bounds a manifest or an index.
	MaxManifestBytes = 4 << 20
	// MaxConfigBytes bounds an image config.
	MaxConfigBytes = 8 << 20
	// MaxLayers bounds an image's layers.
	MaxLayers = 256
)

// imageInfo is what Build needs of an image before reading its layers,
// all checked: the manifest, the config's bytes (whose sha256 is the
// manifest's config digest) and the config parsed.
type imageInfo struct {
	manifest *v1.Manifest
	digest   string // "sha256:<hex>" of the config
	config   *v1.ConfigFile
}

// readConfig reads and checks an image's manifest and config: bounded
// sizes, the config's digest, linux/amd64, as many layers as diff_ids.
func readConfig(img v1.Image) (*imageInfo, []byte, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, nil, fmt.Errorf("manifest: %w", err)
	}
	if m.Config.Size > MaxConfigBytes {
		return nil, nil, fmt.Errorf("config of %d bytes, more than %d", m.Config.Size, MaxConfigBytes)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	if len(raw) > MaxConfigBytes {
		return nil, nil, fmt.Errorf("config of %d bytes, more than %d", len(raw), MaxConfigBytes)
	}
	if err := checkDigest(m.Config.Digest, raw, "config"); err != nil {
		return nil, nil, err
	}
	cf, err := parseConfig(raw)
	if err != nil {
		return nil, nil, err
	}
	if len(m.Layers) > MaxLayers {
		return nil, nil, fmt.Errorf("%d layers, more than %d", len(m.Layers), MaxLayers)
	}
	if len(m.Layers) != len(cf.RootFS.DiffIDs) {
		return nil, nil, fmt.Errorf("the manifest has %d layers, the config %d diff_ids", len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	for i, l := range m.Layers {
		if !knownLayer(l.MediaType) {
			return nil, nil, fmt.Errorf("layer %d: media type %q is not a layer type this builder reads", i+1, l.MediaType)
		}
		if l.Digest.Algorithm != "sha256" || cf.RootFS.DiffIDs[i].Algorithm != "sha256" {
			return nil, nil, fmt.Errorf("layer %d: only sha256 digests are supported", i+1)
		}
		if l.Size < 0 {
			return nil, nil, fmt.Errorf("layer %d: negative size %d", i+1, l.Size)
		}
	}
	return &imageInfo{manifest: m, digest: m.Config.Digest.String(), config: cf}, raw, nil
}

// parseConfig parses an image config (at most MaxConfigBytes) and checks
// its platform.
func parseConfig(raw []byte) (*v1.ConfigFile, error) {
	if len(raw) > MaxConfigBytes {
		return nil, fmt.Errorf("config of %d bytes, more than %d", len(raw), MaxConfigBytes)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if (cf.OS != "" || cf.Architecture != "") && (cf.OS != Platform.OS || cf.Architecture != Platform.Architecture) {
		p := cf.OS + "/" + cf.Architecture
		if cf.Variant != "" {
			p += "/" + cf.Variant
		}
		return nil, fmt.Errorf("an image for %s: Warren runs linux/amd64 only", p)
	}
	if cf.RootFS.Type != "" && cf.RootFS.Type != "layers" {
		return nil, fmt.Errorf("config rootfs type %q, not \"layers\"", cf.RootFS.Type)
	}
	return cf, nil
}

// guestConfig is what goes to imageconfig.Path: the part of the image
// config the guest honours, checked as the guest will check it. A relative
// WorkingDir is taken from "/" (as Docker does) and cleaned.
func guestConfig(cf *v1.ConfigFile, ref, digest string) (imageconfig.Config, error) {
	c := imageconfig.Config{
		Version:    imageconfig.Version,
		Ref:        ref,
		Digest:     digest,
		Env:        cf.Config.Env,
		User:       cf.Config.User,
		Entrypoint: cf.Config.Entrypoint,
		Cmd:        cf.Config.Cmd,
	}
	if wd := cf.Config.WorkingDir; wd != "" {
		c.WorkingDir = path.Clean("/" + wd)
	}
	if err := c.Check(); err != nil {
		return imageconfig.Config{}, fmt.Errorf("image config: %w", err)
	}
	return c, nil
}
