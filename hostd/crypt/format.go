package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Format constants; see the package documentation for the layout.
const (
	Magic            = "WARRENC1"
	Version          = 1
	HeaderSize       = 160 // bytes, fixed
	TagSize          = 16  // AES-GCM tag appended to every chunk
	DefaultChunkSize = 64 << 10
	MinChunkSize     = 4 << 10
	MaxChunkSize     = 16 << 20

	macOffset = HeaderSize - sha256.Size // HMAC over [0, macOffset)
	aadSize   = sha256.Size + 8 + 1 + 8
)

const (
	infoChunk  = "warren chunk v1"
	infoHeader = "warren header v1"
)

// header is the parsed fixed header.
type header struct {
	chunkSize int
	salt      [32]byte
	keyID     string
}

// encode lays the header out without its MAC (bytes [macOffset,
// HeaderSize) are zero).
func (h *header) encode() []byte {
	b := make([]byte, HeaderSize)
	copy(b[0:8], Magic)
	binary.BigEndian.PutUint16(b[8:10], Version)
	binary.BigEndian.PutUint16(b[10:12], 0) // flags
	binary.BigEndian.PutUint32(b[12:16], uint32(h.chunkSize))
	copy(b[16:48], h.salt[:])
	b[48] = byte(len(h.keyID))
	copy(b[64:128], h.keyID)
	return b
}

// parseHeader checks everything in the header that needs no key.
func parseHeader(b []byte) (header, error) {
	var h header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrFormat, len(b), HeaderSize)
	}
	if string(b[0:8]) != Magic {
		return h, fmt.Errorf("%w: bad magic %q, want %q", ErrFormat, b[0:8], Magic)
	}
	if v := binary.BigEndian.Uint16(b[8:10]); v != Version {
		return h, fmt.Errorf("%w: format version %d, this build reads %d", ErrFormat, v, Version)
	}
	if f := binary.BigEndian.Uint16(b[10:12]); f != 0 {
		return h, fmt.Errorf("%w: unknown flags 0x%04x", ErrFormat, f)
	}
	cs := binary.BigEndian.Uint32(b[12:16])
	if err := checkChunkSize(int64(cs)); err != nil {
		return h, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	h.chunkSize = int(cs)
	copy(h.salt[:], b[16:48])
	n := int(b[48])
	for _, c := range b[49:64] {
		if c != 0 {
			return h, fmt.Errorf("%w: reserved header bytes are not zero", ErrFormat)
		}
	}
	if n > MaxKeyIDLen {
		return h, fmt.Errorf("%w: key ID length %d > %d", ErrFormat, n, MaxKeyIDLen)
	}
	for _, c := range b[64+n : 128] {
		if c != 0 {
			return h, fmt.Errorf("%w: key ID padding is not zero", ErrFormat)
		}
	}
	h.keyID = string(b[64 : 64+n])
	if err := checkKeyID(h.keyID); err != nil {
		return h, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	return h, nil
}

func checkChunkSize(cs int64) error {
	if cs < MinChunkSize || cs > MaxChunkSize || cs&(cs-1) != 0 {
		return fmt.Errorf("chunk size %d is not a power of two in [%d, %d]", cs, MinChunkSize, MaxChunkSize)
	}
	return nil
}

// fileKeys are the per-file keys derived from the tenant key and salt.
type fileKeys struct {
	aead   cipher.AEAD
	macKey []byte
}

func deriveKeys(key Key, salt []byte) (*fileKeys, error) {
	if !key.Valid() {
		return nil, fmt.Errorf("crypt: zero Key")
	}
	ck, err := hkdf.Key(sha256.New, key.material(), salt, infoChunk, 32)
	if err != nil {
		return nil, err
	}
	defer clear(ck)
	mk, err := hkdf.Key(sha256.New, key.material(), salt, infoHeader, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(ck)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &fileKeys{aead: aead, macKey: mk}, nil
}

// headerMAC is HMAC-SHA256(macKey, header[0:macOffset]).
func (k *fileKeys) headerMAC(hdr []byte) []byte {
	m := hmac.New(sha256.New, k.macKey)
	m.Write(hdr[:macOffset])
	return m.Sum(nil)
}

// nonce for chunk i: 8-byte big-endian index, 4 zero bytes.
func chunkNonce(nonce *[12]byte, i uint64) []byte {
	binary.BigEndian.PutUint64(nonce[0:8], i)
	clear(nonce[8:])
	return nonce[:]
}

// chunkAAD: SHA-256(header) || index || final flag || total plaintext
// length (final chunk only; zero otherwise).
func chunkAAD(aad *[aadSize]byte, hhash *[32]byte, i uint64, final bool, total uint64) []byte {
	copy(aad[0:32], hhash[:])
	binary.BigEndian.PutUint64(aad[32:40], i)
	aad[40] = 0
	binary.BigEndian.PutUint64(aad[41:49], 0)
	if final {
		aad[40] = 1
		binary.BigEndian.PutUint64(aad[41:49], total)
	}
	return aad[:]
}

// layout is what a file's size says about its chunks.
type layout struct {
	chunkSize int64
	chunks    int64 // >= 1
	lastLen   int64 // plaintext bytes in the final chunk
	size      int64 // plaintext length
}

// layoutFor derives the chunk layout from the file size. Every file has at
// least one chunk; only an empty file's (single) chunk is empty.
func layoutFor(fileSize int64, chunkSize int) (layout, error) {
	cs := int64(chunkSize)
	l := layout{chunkSize: cs}
	body := fileSize - HeaderSize
	if body < TagSize {
		return l, fmt.Errorf("file is %d bytes, too short to hold a chunk", fileSize)
	}
	stride := cs + TagSize
	l.chunks = (body + stride - 1) / stride
	lastCT := body - (l.chunks-1)*stride
	if lastCT < TagSize || (l.chunks > 1 && lastCT == TagSize) {
		return l, fmt.Errorf("file length %d matches no chunk layout", fileSize)
	}
	l.lastLen = lastCT - TagSize
	l.size = (l.chunks-1)*cs + l.lastLen
	return l, nil
}

// chunkOffset is where ciphertext chunk i starts.
func chunkOffset(i int64, chunkSize int) int64 {
	return HeaderSize + i*(int64(chunkSize)+TagSize)
}
