// Command memtouch holds guest memory for the snapshot benchmark
// (bench/snapshot): it maps N MiB of anonymous memory, fills every page
// with pseudo-random bytes (so that neither a zero-page check nor
// compression makes the pages cheaper to save than a real program's),
// prints "ready N", then reads commands on standard input, one a line:
//
//	dirty K   writes one byte in each page of the first K MiB; replies "ok K"
//
// It exits at the end of its input. The writes are plain user-mode stores,
// so the VMM sees them only through KVM's dirty log (or, for QEMU, its
// migration dirty bitmap), as it would any guest program's.
//
//	memtouch MIB
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: memtouch MIB")
		os.Exit(2)
	}
	mib, err := strconv.Atoi(os.Args[1])
	if err != nil || mib <= 0 {
		fmt.Fprintf(os.Stderr, "memtouch: bad size %q\n", os.Args[1])
		os.Exit(2)
	}
	// Outside the Go heap, so the garbage collector never scans or moves it.
	mem, err := syscall.Mmap(-1, 0, mib<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "memtouch:", err)
		os.Exit(1)
	}
	page := os.Getpagesize()
	fill(mem)
	fmt.Printf("ready %d\n", mib)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		k, err := 0, error(nil)
		if len(f) == 2 {
			k, err = strconv.Atoi(f[1])
		}
		if f[0] != "dirty" || len(f) != 2 || err != nil || k < 0 || k > mib {
			fmt.Printf("error %q\n", in.Text())
			continue
		}
		touch(mem[:k<<20], page)
		fmt.Printf("ok %d\n", k)
	}
}

// touch changes one byte in each page of b (a different value each time,
// so every pass really writes).
func touch(b []byte, page int) {
	for i := 0; i < len(b); i += page {
		b[i]++
	}
}

// fill writes pseudo-random words (xorshift64) over all of b, a multiple
// of 8 bytes long.
func fill(b []byte) {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range w {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		w[i] = x
	}
}
