/* Shared pieces of the freestanding test guests (32-bit protected mode). */
#define COM1 0x3f8

/* The PVH entry note: our loader starts the guest at _start. */
#define PVH_NOTE \
	.pushsection .note.Xen, "a", @note; \
	.long 4; .long 4; .long 18; .asciz "Xen"; .long _start; \
	.popsection

/* Print the NUL-terminated string at \str on COM1 (clobbers eax, edx, esi). */
.macro PUTS str
	mov $\str, %esi
	call puts
.endm

/* Power off through the i8042 reset line. */
.macro RESET
	mov $0xfe, %al
	out %al, $0x64
1:	hlt
	jmp 1b
.endm

.macro PUTS_IMPL
puts:
	mov $COM1, %dx
2:	lodsb
	test %al, %al
	jz 3f
	out %al, (%dx)
	jmp 2b
3:	ret
.endm
