/* Interrupts through the in-kernel irqchip: programs the PICs (IRQ 5 only,
   vectors 0x20..), installs an IDT, prints "R", and halts with interrupts on.
   The handler for IRQ 5 prints "I" and powers off. */
#include "common.h"
	.code32
	.text
	.globl _start
_start:
	mov $0x90000, %esp
	/* IDT entry 0x25: 32-bit interrupt gate to handler, selector 0x10. */
	mov $handler, %eax
	mov $idt + 0x25*8, %edi
	mov %ax, (%edi)
	movw $0x10, 2(%edi)
	movw $0x8e00, 4(%edi)
	shr $16, %eax
	mov %ax, 6(%edi)
	lidt idtr
	/* PIC init: ICW1..ICW4, master at 0x20, slave at 0x28. */
	mov $0x11, %al
	out %al, $0x20
	out %al, $0xa0
	mov $0x20, %al
	out %al, $0x21
	mov $0x28, %al
	out %al, $0xa1
	mov $0x04, %al
	out %al, $0x21
	mov $0x02, %al
	out %al, $0xa1
	mov $0x01, %al
	out %al, $0x21
	out %al, $0xa1
	mov $0xdf, %al		/* unmask IRQ 5 only */
	out %al, $0x21
	mov $0xff, %al
	out %al, $0xa1
	PUTS ready
	sti
1:	hlt
	jmp 1b
handler:
	PUTS got
	mov $0x20, %al		/* EOI */
	out %al, $0x20
	RESET
	PUTS_IMPL
	.section .rodata
ready:	.asciz "R"
got:	.asciz "I\n"
	.align 8
idtr:	.word 256*8-1
	.long idt
	.section .bss
	.align 8
idt:	.space 256*8
PVH_NOTE
