package memsnap

import (
	"path/filepath"
	"testing"
)

const benchMem = 64 << 20

// benchOpts are testOpts with the default chunk size.
func benchOpts() Options {
	o := testOpts()
	o.ChunkPages = 0
	return o
}

// benchSim returns 64 MiB of memory with a guest-like mix: a quarter zero
// pages, half compressible text-like pages, a quarter random pages.
func benchSim() *sim {
	s := newSim(benchMem/testPS, 42)
	for p := range s.pages() {
		s.fillPage(p)
	}
	s.resetDirty()
	return s
}

func BenchmarkWriteBase64MiB(b *testing.B) {
	s := benchSim()
	path := filepath.Join(b.TempDir(), "base"+Ext)
	b.SetBytes(benchMem)
	var st Stats
	for b.Loop() {
		l, err := WriteBase(path, s.reader(), benchMem, benchOpts())
		if err != nil {
			b.Fatal(err)
		}
		st = l.Stats()
		l.Close()
	}
	b.ReportMetric(st.Ratio, "ratio")
	b.ReportMetric(float64(st.FileBytes)/(1<<20), "MiB-on-disk")
}

func BenchmarkWriteIncremental1000Pages(b *testing.B) {
	s := benchSim()
	dir := b.TempDir()
	base, err := WriteBase(filepath.Join(dir, "base"+Ext), s.reader(), benchMem, benchOpts())
	if err != nil {
		b.Fatal(err)
	}
	defer base.Close()
	s.writeRandom(1000)
	b.SetBytes(1000 * testPS)
	for b.Loop() {
		l, err := WriteIncremental(filepath.Join(dir, "incr"+Ext), s.reader(), benchMem, s.dirty, base, benchOpts())
		if err != nil {
			b.Fatal(err)
		}
		l.Close()
	}
}

// benchChain writes a base and n incremental layers of 1000 dirty pages.
func benchChain(b *testing.B, n int) *Chain {
	s := benchSim()
	dir := b.TempDir()
	top, err := WriteBase(filepath.Join(dir, "l0"+Ext), s.reader(), benchMem, benchOpts())
	if err != nil {
		b.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		s.resetDirty()
		s.writeRandom(1000)
		next, err := WriteIncremental(filepath.Join(dir, "l"+string(rune('0'+i))+Ext), s.reader(), benchMem, s.dirty, top, benchOpts())
		if err != nil {
			b.Fatal(err)
		}
		top.Close()
		top = next
	}
	top.Close()
	c, err := OpenChain(filepath.Join(dir, "l"+string(rune('0'+n))+Ext), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func benchRestore(b *testing.B, layers int) {
	c := benchChain(b, layers)
	dst := make([]byte, benchMem)
	b.SetBytes(benchMem)
	for b.Loop() {
		if err := c.Restore(dst); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRestore64MiB(b *testing.B)        { benchRestore(b, 0) }
func BenchmarkRestoreChain4x64MiB(b *testing.B) { benchRestore(b, 3) }

func BenchmarkVerify64MiB(b *testing.B) {
	c := benchChain(b, 0)
	b.SetBytes(benchMem)
	for b.Loop() {
		if err := c.Verify(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFlatten64MiB(b *testing.B) {
	c := benchChain(b, 3)
	path := filepath.Join(b.TempDir(), "flat.img")
	b.SetBytes(benchMem)
	for b.Loop() {
		if err := c.Flatten(path); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompact4x64MiB(b *testing.B) {
	c := benchChain(b, 3)
	path := filepath.Join(b.TempDir(), "compact"+Ext)
	b.SetBytes(benchMem)
	for b.Loop() {
		l, err := Compact(c, path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		l.Close()
	}
}
