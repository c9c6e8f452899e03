/* Checks the PVH start info the VMM passed in EBX, prints a line on COM1 and
   powers off through the i8042. */
#include "common.h"
	.code32
	.text
	.globl _start
_start:
	mov $0x90000, %esp
	cmpl $0x336ec578, (%ebx)	/* hvm_start_info.magic */
	jne bad
	PUTS ok
	RESET
bad:
	PUTS notok
	RESET
	PUTS_IMPL
	.section .rodata
ok:	.asciz "hello from a PVH guest\n"
notok:	.asciz "bad start info\n"
PVH_NOTE
