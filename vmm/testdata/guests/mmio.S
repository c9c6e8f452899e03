/* MMIO exits: reads one byte at 0xd0000010 and prints it, writes the dword
   0x12345678 at 0xd0000000, then powers off. */
#include "common.h"
	.code32
	.text
	.globl _start
_start:
	mov $0x90000, %esp
	movb 0xd0000010, %al
	mov $COM1, %dx
	out %al, (%dx)
	movl $0x12345678, 0xd0000000
	RESET
PVH_NOTE
