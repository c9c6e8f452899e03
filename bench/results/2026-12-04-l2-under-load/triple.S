/* A deliberate triple fault: an IDT of limit 0, then int3. */
#include "common.h"
	.code32
	.text
	.globl _start
_start:
	mov $0x90000, %esp
	PUTS msg
	lidt zeroidt
	int3
1:	hlt
	jmp 1b
	PUTS_IMPL
	.section .rodata
msg:	.asciz "about to triple-fault\n"
zeroidt:	.word 0
	.long 0
PVH_NOTE
