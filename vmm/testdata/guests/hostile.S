/* A hostile driver: scribbles on every virtio-mmio window and points the
   devices' queues at random memory. For ITERS turns it writes random values
   (biased towards the queue and status registers, queue addresses inside
   the random region) to a random register of one of the first 8 windows at
   0xd0000000, reads one now and then, re-randomises part of the region, and
   every 256 turns brings a random window up properly (reset, features as
   offered, queues 0-2 with random sizes and addresses, DRIVER_OK) and
   notifies it, so that the device parses the garbage as descriptors. Then it prints
   "survived" and powers off. The host must not crash or hang; devices that
   find garbage go to NEEDS_RESET. */
#include "common.h"
#define MMIO 0xd0000000
#define RAND 0x400000		/* the random region the queues point into */
#define RANDSZ 0x40000
#define ITERS 40000
	.code32
	.text
	.globl _start
_start:
	mov $0x90000, %esp
	mov $0x2545f491, %ebx	/* xorshift32 state */
	/* Fill the random region. */
	mov $RAND, %edi
1:	call rnd
	mov %eax, (%edi)
	add $4, %edi
	cmp $RAND+RANDSZ, %edi
	jb 1b
	mov $ITERS, %ebp
turn:
	call rnd
	mov %eax, %edi
	and $0x7000, %edi	/* window 0-7 */
	add $MMIO, %edi
	call rnd
	mov %eax, %ecx
	and $15, %ecx
	movzwl regs(,%ecx,2), %esi
	cmp $0xfff, %esi
	jne 2f
	call rnd		/* any register or config byte */
	and $0x1fc, %eax
	mov %eax, %esi
2:	call rnd
	/* Addresses go into the random region, sizes stay small-ish. */
	cmp $0x80, %esi
	je addr
	cmp $0x90, %esi
	je addr
	cmp $0xa0, %esi
	je addr
	cmp $0x38, %esi
	jne 3f
	and $0x3ff, %eax
	jmp 3f
addr:	and $RANDSZ-16, %eax
	add $RAND, %eax
3:	mov %eax, (%edi,%esi)
	/* A read every 16 turns. */
	test $15, %ebp
	jnz 4f
	call rnd
	and $0x1fc, %eax
	mov (%edi,%eax), %eax
	/* Re-randomise 64 words of the region every 1024 turns. */
4:	test $1023, %ebp
	jnz 6f
	call rnd
	and $RANDSZ-256, %eax
	lea RAND(%eax), %edx
	mov $64, %ecx
5:	call rnd
	mov %eax, (%edx)
	add $4, %edx
	loop 5b
	/* A proper bring-up of a random window every 256 turns. */
6:	test $255, %ebp
	jnz 7f
	call bringup
7:	dec %ebp
	jnz turn
	PUTS msg
	RESET

/* bringup: reset the window at edi, accept its features, set queues 0-2
   up on random addresses and power-of-two sizes, DRIVER_OK, notify queue 0
   or 1 a few times. */
bringup:
	movl $0, 0x70(%edi)	/* reset */
	movl $1, 0x70(%edi)	/* ACKNOWLEDGE */
	movl $3, 0x70(%edi)	/* DRIVER */
	movl $0, 0x14(%edi)
	mov 0x10(%edi), %eax
	movl $0, 0x24(%edi)
	mov %eax, 0x20(%edi)
	movl $1, 0x14(%edi)
	mov 0x10(%edi), %eax
	movl $1, 0x24(%edi)
	mov %eax, 0x20(%edi)
	movl $0xb, 0x70(%edi)	/* FEATURES_OK */
	xor %ecx, %ecx		/* queues 0-2 */
9:	mov %ecx, 0x30(%edi)	/* QueueSel */
	call rnd
	and $7, %eax
	mov %ecx, %edx
	mov %eax, %ecx
	mov $1, %eax
	shl %cl, %eax		/* size 1-128, a power of two */
	mov %edx, %ecx
	mov %eax, 0x38(%edi)
	call rnd
	and $RANDSZ-4096, %eax
	add $RAND, %eax
	mov %eax, 0x80(%edi)	/* descriptors */
	movl $0, 0x84(%edi)
	mov %eax, %esi
	call plausible
	lea 0x800(%esi), %eax
	mov %eax, 0x90(%edi)	/* available ring */
	movl $0, 0x94(%edi)
	call rnd
	and $RANDSZ-4096, %eax
	add $RAND, %eax
	mov %eax, 0xa0(%edi)	/* used ring */
	movl $0, 0xa4(%edi)
	movl $1, 0x44(%edi)	/* QueueReady */
	inc %ecx
	cmp $3, %ecx
	jb 9b
	movl $0xf, 0x70(%edi)	/* DRIVER_OK */
	mov $4, %ecx
8:	call rnd
	and $1, %eax
	mov %eax, 0x50(%edi)	/* notify queue 0 or 1 */
	mov 0x60(%edi), %eax
	mov %eax, 0x64(%edi)	/* acknowledge what is pending */
	loop 8b
	ret

/* plausible: make the first two descriptors of the table at esi point
   into the random region (random lengths up to 4 KiB, random NEXT, WRITE
   and INDIRECT flags, next 0-3) and publish one of them as the single
   entry of the available ring at esi+0x800, so that the device walks a
   chain instead of refusing the ring's index. Keeps ecx, edx, esi. */
plausible:
	push %ecx
	push %esi
	mov $2, %ecx
10:	call rnd
	and $RANDSZ-16, %eax
	add $RAND, %eax
	mov %eax, (%esi)	/* addr */
	movl $0, 4(%esi)
	call rnd
	and $0xfff, %eax
	mov %eax, 8(%esi)	/* len */
	call rnd
	and $0x30007, %eax
	mov %eax, 12(%esi)	/* flags, next */
	add $16, %esi
	loop 10b
	pop %esi
	movw $0, 0x800(%esi)	/* avail flags */
	movw $1, 0x802(%esi)	/* avail idx */
	call rnd
	and $1, %eax
	mov %ax, 0x804(%esi)	/* ring[0]: head 0 or 1 */
	pop %ecx
	ret

/* rnd: the next xorshift32 value in eax and ebx. */
rnd:
	mov %ebx, %eax
	shl $13, %eax
	xor %eax, %ebx
	mov %ebx, %eax
	shr $17, %eax
	xor %eax, %ebx
	mov %ebx, %eax
	shl $5, %eax
	xor %eax, %ebx
	mov %ebx, %eax
	ret

	PUTS_IMPL

	.section .rodata
/* Registers a turn writes: QueueSel, QueueNum, QueueReady, QueueNotify,
   InterruptACK, Status (twice), queue addresses low and high, the feature
   selectors and words, and 0xfff: any offset. */
regs:	.word 0x30, 0x38, 0x44, 0x50, 0x50, 0x64, 0x70, 0x70
	.word 0x80, 0x84, 0x90, 0xa0, 0x24, 0x20, 0xfff, 0xfff
msg:	.asciz "survived\n"
PVH_NOTE
