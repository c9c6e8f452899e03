package crypt

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/warrenvm/warren/internal/atomicfile"
)

// EncryptFile encrypts src into dst under key with the default chunk size.
// It writes a temporary file in dst's directory, fsyncs it, renames it
// over dst and fsyncs the directory, so dst is never a half-written file;
// on failure the temporary file is removed.
func EncryptFile(dst, src string, key Key) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("crypt: encrypt: %w", err)
	}
	defer in.Close()
	err = atomicfile.WriteFunc(dst, 0o600, func(f *os.File) error {
		return sealInto(f, key, func(w io.Writer) error {
			_, err := io.Copy(w, in)
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("crypt: encrypt %s: %w", filepath.Base(src), err)
	}
	return nil
}

// sealInto writes to f, encrypted under key, what fill writes.
func sealInto(f io.Writer, key Key, fill func(w io.Writer) error) error {
	w, err := NewWriter(f, key, nil)
	if err != nil {
		return err
	}
	if err := fill(w); err != nil {
		return err
	}
	return w.Close()
}

// DecryptFile decrypts src, encrypted for tenant, into dst the same way
// (temporary file, fsync, rename, directory fsync). If any chunk fails
// authentication, dst is not created or replaced and the partial
// plaintext is removed.
func DecryptFile(dst, src string, p Provider, tenant string) error {
	return withReader(src, p, tenant, func(r *Reader) error {
		return atomicfile.WriteFunc(dst, 0o600, func(f *os.File) error {
			_, err := io.Copy(f, r)
			return err
		})
	})
}

// withReader opens src, encrypted for tenant, for use, then closes it.
func withReader(src string, p Provider, tenant string, use func(r *Reader) error) error {
	r, err := Open(context.Background(), src, p, tenant)
	if err != nil {
		return err
	}
	defer r.Close()
	return use(r)
}
