//go:build linux && amd64

package jail

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Classic BPF opcodes used by the seccomp program (linux/filter.h).
const (
	bpfLdWAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJEqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJSetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfJA     = unix.BPF_JMP | unix.BPF_JA
	bpfAndK   = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K

	// maxInsns is BPF_MAXINSNS: the kernel refuses longer programs.
	maxInsns = 4096
)

// struct seccomp_data offsets (x86_64 is little endian: the low 32 bits of
// argument i are at 16+8*i).
const (
	offNr   = 0
	offArch = 4
)

func offArgLow(i int) uint32 { return uint32(16 + 8*i) }

// insn is one instruction before label resolution. Conditional jumps name
// their targets by label ("" = the next instruction); JA names its target
// in ja.
type insn struct {
	code   uint16
	k      uint32
	jt, jf string
	ja     string
}

// asm is a tiny label-resolving assembler for classic BPF.
type asm struct {
	ins    []insn
	labels map[string]int
	n      int
}

func newAsm() *asm { return &asm{labels: map[string]int{}} }

// newLabel returns a fresh, unique label name.
func (a *asm) newLabel(prefix string) string {
	a.n++
	return fmt.Sprintf("%s.%d", prefix, a.n)
}

// mark defines label l at the next instruction emitted.
func (a *asm) mark(l string) {
	if _, dup := a.labels[l]; dup {
		panic("jail: duplicate BPF label " + l)
	}
	a.labels[l] = len(a.ins)
}

func (a *asm) ld(off uint32) { a.ins = append(a.ins, insn{code: bpfLdWAbs, k: off}) }
func (a *asm) and(k uint32)  { a.ins = append(a.ins, insn{code: bpfAndK, k: k}) }
func (a *asm) ret(k uint32)  { a.ins = append(a.ins, insn{code: bpfRetK, k: k}) }
func (a *asm) jmp(l string)  { a.ins = append(a.ins, insn{code: bpfJA, ja: l}) }
func (a *asm) jeq(k uint32, jt, jf string) {
	a.ins = append(a.ins, insn{code: bpfJEqK, k: k, jt: jt, jf: jf})
}
func (a *asm) jset(k uint32, jt, jf string) {
	a.ins = append(a.ins, insn{code: bpfJSetK, k: k, jt: jt, jf: jf})
}

// assemble resolves labels. Classic BPF conditional jumps have 8-bit
// forward offsets; a target further than 255 instructions is an error (the
// program builder keeps them short with trampolines).
func (a *asm) assemble() ([]unix.SockFilter, error) {
	if len(a.ins) > maxInsns {
		return nil, fmt.Errorf("jail: seccomp program has %d instructions, the kernel allows %d", len(a.ins), maxInsns)
	}
	off := func(pc int, l string) (int, error) {
		if l == "" {
			return 0, nil
		}
		t, ok := a.labels[l]
		if !ok {
			return 0, fmt.Errorf("jail: undefined BPF label %q", l)
		}
		d := t - (pc + 1)
		if d < 0 {
			return 0, fmt.Errorf("jail: backward BPF jump to %q at %d", l, pc)
		}
		return d, nil
	}
	out := make([]unix.SockFilter, len(a.ins))
	for pc, in := range a.ins {
		f := unix.SockFilter{Code: in.code, K: in.k}
		if in.code == bpfJA {
			d, err := off(pc, in.ja)
			if err != nil {
				return nil, err
			}
			f.K = uint32(d)
		} else if in.code&0x07 == unix.BPF_JMP {
			for _, j := range []struct {
				l   string
				dst *uint8
			}{{in.jt, &f.Jt}, {in.jf, &f.Jf}} {
				d, err := off(pc, j.l)
				if err != nil {
					return nil, err
				}
				if d > 255 {
					return nil, fmt.Errorf("jail: BPF jump at %d to %q is %d instructions, more than 255", pc, j.l, d)
				}
				*j.dst = uint8(d)
			}
		}
		out[pc] = f
	}
	return out, nil
}

// chunkSize bounds how many compares share one block of trampolines. A
// block is at most chunkSize compares, one JA and at most chunkSize
// trampolines, so every conditional jump stays under 2*chunkSize+1 <= 255.
const chunkSize = 100

// target is where a matched compare goes: a return value (ret) or a label
// (code placed elsewhere), reached through a trampoline either way.
type target struct {
	isRet bool
	ret   uint32
	label string
}

type dispatch struct {
	k uint32
	t target
}

// emitDispatch emits "A == k -> t" for every entry, in order, with every
// conditional jump short: entries are cut into blocks; each compare jumps
// to a trampoline right after its block (a RET, or a JA with a 32-bit
// offset). A value matching no entry falls through past the last block.
func (a *asm) emitDispatch(entries []dispatch) {
	for len(entries) > 0 {
		n := min(chunkSize, len(entries))
		block := entries[:n]
		entries = entries[n:]
		next := a.newLabel("next")
		tramp := map[target]string{}
		var order []target
		for _, e := range block {
			l, ok := tramp[e.t]
			if !ok {
				l = a.newLabel("tramp")
				tramp[e.t] = l
				order = append(order, e.t)
			}
			a.jeq(e.k, l, "")
		}
		a.jmp(next)
		for _, t := range order {
			a.mark(tramp[t])
			if t.isRet {
				a.ret(t.ret)
			} else {
				a.jmp(t.label)
			}
		}
		a.mark(next)
	}
}
