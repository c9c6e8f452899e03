package crypt

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	err = writeAtomic(dst, func(f *os.File) error {
		w, err := NewWriter(f, key, nil)
		if err != nil {
			return err
		}
		if _, err := io.Copy(w, in); err != nil {
			return err
		}
		return w.Close()
	})
	if err != nil {
		return fmt.Errorf("crypt: encrypt %s: %w", filepath.Base(src), err)
	}
	return nil
}

// DecryptFile decrypts src, encrypted for tenant, into dst the same way
// (temporary file, fsync, rename, directory fsync). If any chunk fails
// authentication, dst is not created or replaced and the partial
// plaintext is removed.
func DecryptFile(dst, src string, p Provider, tenant string) error {
	r, err := Open(context.Background(), src, p, tenant)
	if err != nil {
		return err
	}
	defer r.Close()
	return writeAtomic(dst, func(f *os.File) error {
		_, err := io.Copy(f, r)
		return err
	})
}

// writeAtomic has fill write a temporary file next to path, then makes it
// path durably (fsync, rename, fsync of the directory).
func writeAtomic(path string, fill func(*os.File) error) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = fill(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}
