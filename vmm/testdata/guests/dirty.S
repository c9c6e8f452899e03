/* Dirty-page logging: writes one byte into pages 0, 3, 5, 64 and 100 of the
   region starting at 2 MiB, prints "D" and powers off. */
#include "common.h"
	.code32
	.text
	.globl _start
_start:
	mov $0x90000, %esp
	mov $pages, %esi
	mov $npages, %ecx
1:	mov (%esi), %eax
	shl $12, %eax
	add $0x200000, %eax
	movb $0xaa, (%eax)
	add $4, %esi
	loop 1b
	PUTS done
	RESET
	PUTS_IMPL
	.section .rodata
pages:	.long 0, 3, 5, 64, 100
	.set npages, (. - pages) / 4
done:	.asciz "D\n"
PVH_NOTE
