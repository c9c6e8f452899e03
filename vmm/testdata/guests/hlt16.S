/* Raw KVM exits without an irqchip: 16-bit real mode at 0x1000. Writes "ok"
   to port 0x3f8 (two KVM_EXIT_IO), adds the registers the host preset, and
   halts (KVM_EXIT_HLT). Built as a flat binary. */
	.code16
	.text
	.globl _start
_start:
	mov $0x3f8, %dx
	mov $'o', %al
	out %al, (%dx)
	mov $'k', %al
	out %al, (%dx)
	add %bx, %cx		/* host set BX and CX; it checks CX afterwards */
	hlt
