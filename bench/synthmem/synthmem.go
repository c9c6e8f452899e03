// Package synthmem makes synthetic guest memory for benchmarks that need
// memory images without VMs (bench/store, bench/objstore): pages of mixed
// random and repetitive 64-byte lines, so that zstd compresses them about
// as much as a booted Linux guest's memory (ratio ~2.2), and zero pages
// in between.
package synthmem

import "math/rand/v2"

// PageSize is the pages' size.
const PageSize = 4096

// Fill writes pg as a page of mixed random and repetitive 64-byte lines
// drawn from r (a third of the lines random).
func Fill(pg []byte, r *rand.Rand) {
	for i := 0; i < len(pg); i += 64 {
		line := pg[i:min(i+64, len(pg))]
		if r.IntN(3) == 0 {
			for j := range line {
				line[j] = byte(r.Uint32())
			}
		} else {
			v := byte(r.Uint32())
			for j := range line {
				line[j] = v + byte(j&3)
			}
		}
	}
}

// Image returns mib MiB of memory whose pages are each, with probability
// used, filled (Fill), else zero; the same arguments give the same bytes.
func Image(mib int, used float64, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	mem := make([]byte, mib<<20)
	for p := 0; p < len(mem)/PageSize; p++ {
		if r.Float64() < used {
			Fill(mem[p*PageSize:(p+1)*PageSize], r)
		}
	}
	return mem
}
