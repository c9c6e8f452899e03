package boot

import (
	"fmt"

	"github.com/warrenvm/warren/vmm/guestmem"
)

// E820 entry types.
const (
	E820RAM      = 1
	E820Reserved = 2
)

// maxE820 is the number of entries boot_params can hold.
const maxE820 = 128

// E820Entry is one range of the guest's physical memory map.
type E820Entry struct {
	Addr uint64
	Size uint64
	Type uint32
}

// E820 returns the memory map for RAM laid out as regions: base memory up to
// the MP table, the MP table reserved, the legacy hole left out, then RAM from
// 1 MiB (and above 4 GiB when RAM crosses the MMIO hole).
func E820(regions []guestmem.Region) ([]E820Entry, error) {
	if len(regions) == 0 || regions[0].GPA != 0 || regions[0].Size < 2*HighMemStart {
		return nil, fmt.Errorf("boot: guest RAM must start at 0 and be at least %d MiB", 2*HighMemStart>>20)
	}
	m := []E820Entry{
		{0, MPTableAddr, E820RAM},
		{MPTableAddr, 0xa0000 - MPTableAddr, E820Reserved},
		{HighMemStart, regions[0].Size - HighMemStart, E820RAM},
	}
	for _, r := range regions[1:] {
		m = append(m, E820Entry{r.GPA, r.Size, E820RAM})
	}
	return m, nil
}
