/* Pause/resume and save/restore: counts forever. Each turn increments the
   word at COUNTER and EBX and checks that they agree (a restore that lost
   memory or registers prints "X" and powers off). Every 2^18 turns it reads
   a word from port 0x510 (a test device), adds it to the word at SUM and
   prints "." on COM1. */
#include "common.h"
#define COUNTER 0x300000
#define SUM 0x300004
#define PORT 0x510
	.code32
	.text
	.globl _start
_start:
	mov $0x90000, %esp
	xor %ebx, %ebx
	movl $0, COUNTER
	movl $0, SUM
1:	incl COUNTER
	inc %ebx
	cmp COUNTER, %ebx
	jne bad
	test $0x3ffff, %ebx
	jnz 1b
	mov $PORT, %dx
	in (%dx), %eax		/* opcode 0xed: the tests look for it */
	add %eax, SUM
	mov $'.', %al
	mov $COM1, %dx
	out %al, (%dx)
	jmp 1b
bad:
	mov $'X', %al
	mov $COM1, %dx
	out %al, (%dx)
	RESET
PVH_NOTE
