/*
 * procstress: a freestanding Linux x86-64 program (no libc) that checks a
 * guest kernel keeps processes apart under concurrency.
 *
 *   procstress [PROCESSES [ITERATIONS [corrupt]]]
 *
 * It forks PROCESSES children (default 16). Every child maps the same four
 * pages at the same fixed virtual address, fills them with a pattern of its
 * own, and then ITERATIONS times (default 2000): loads xmm0-15 and rbx, rbp,
 * r12-r15 with values of its own, makes a system call (getpid and
 * sched_yield in turn, so that the processes switch), checks that every one
 * of those registers came back unchanged (the kernel must preserve all but
 * rax, rcx and r11), and checks and rewrites every word of its pages. A
 * register or a word of another process, or of another iteration, is
 * reported on stdout. The parent prints one summary line and exits 1 when
 * any child failed.
 *
 * Written for issue 18: on one PVM host, 16 concurrent short-lived Go
 * processes in a guest crashed with corrupted stacks, while one at a time
 * never did. Every process here has the same addresses (as static Go
 * programs do), so memory or register state that leaks from one process to
 * another shows up as a wrong value.
 *
 * "corrupt" is the self-test: child 1 spoils one register value and one
 * word of its pages once, and so must be reported as failed.
 *
 * Built by `make testguests` (and by vmm/testguest.BuildProgram) with
 * gcc -O1 -static -nostdlib -ffreestanding -mno-red-zone.
 */
typedef unsigned long u64;

enum { SYS_write = 1, SYS_mmap = 9, SYS_sched_yield = 24, SYS_getpid = 39,
       SYS_fork = 57, SYS_exit = 60, SYS_wait4 = 61 };

static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
	long r;
	register long r10 asm("r10") = d;
	register long r8 asm("r8") = e;
	register long r9 asm("r9") = f;
	asm volatile("syscall"
		     : "=a"(r)
		     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
		     : "rcx", "r11", "memory");
	return r;
}

static void put(const char *s)
{
	long n = 0;
	while (s[n])
		n++;
	sys6(SYS_write, 1, (long)s, n, 0, 0, 0);
}

static void putnum(u64 v)
{
	char b[24];
	int i = 23;
	b[i] = 0;
	do {
		b[--i] = '0' + v % 10;
		v /= 10;
	} while (v);
	put(b + i);
}

static void puthex(u64 v)
{
	char b[19];
	b[0] = '0';
	b[1] = 'x';
	b[18] = 0;
	for (int i = 17; i >= 2; i--, v >>= 4)
		b[i] = "0123456789abcdef"[v & 15];
	put(b);
}

static u64 atou(const char *s)
{
	u64 v = 0;
	while (*s >= '0' && *s <= '9')
		v = v * 10 + (*s++ - '0');
	return v;
}

/* The pages every child maps at the same address. */
#define PAGES ((volatile u64 *)0x200000000UL)
#define WORDS (4 * 4096 / 8)

/* What one checked system call loads and finds; the offsets are fixed
 * because the assembly below uses them. */
struct regcheck {
	u64 xin[16][2];   /*   0: xmm0-15 before */
	u64 xout[16][2];  /* 256: xmm0-15 after */
	u64 gin[6];       /* 512: rbx, rbp, r12-r15 before */
	u64 gout[6];      /* 560: the same after */
	long nr;          /* 608: the system call */
};

/* syscall_regs makes system call nr with the registers loaded from tag and
 * returns a mask of those that changed (bit i: xmm i; bit 16+i: the i-th
 * general register); spoil makes it report xmm3 as changed. */
static u64 syscall_regs(u64 tag, long nr, int spoil)
{
	struct regcheck c;
	for (int i = 0; i < 16; i++) {
		c.xin[i][0] = tag * 31 + i;
		c.xin[i][1] = ~(tag * 17 + i);
	}
	for (int i = 0; i < 6; i++)
		c.gin[i] = tag * 1000003 + i;
	c.nr = nr;
	asm volatile(
		"push %%rbp\n push %%rdi\n"
		"movdqu 0(%%rdi),%%xmm0\n movdqu 16(%%rdi),%%xmm1\n movdqu 32(%%rdi),%%xmm2\n movdqu 48(%%rdi),%%xmm3\n"
		"movdqu 64(%%rdi),%%xmm4\n movdqu 80(%%rdi),%%xmm5\n movdqu 96(%%rdi),%%xmm6\n movdqu 112(%%rdi),%%xmm7\n"
		"movdqu 128(%%rdi),%%xmm8\n movdqu 144(%%rdi),%%xmm9\n movdqu 160(%%rdi),%%xmm10\n movdqu 176(%%rdi),%%xmm11\n"
		"movdqu 192(%%rdi),%%xmm12\n movdqu 208(%%rdi),%%xmm13\n movdqu 224(%%rdi),%%xmm14\n movdqu 240(%%rdi),%%xmm15\n"
		"mov 512(%%rdi),%%rbx\n mov 520(%%rdi),%%rbp\n mov 528(%%rdi),%%r12\n"
		"mov 536(%%rdi),%%r13\n mov 544(%%rdi),%%r14\n mov 552(%%rdi),%%r15\n"
		"mov 608(%%rdi),%%rax\n"
		"syscall\n"
		"pop %%rdi\n"
		"mov %%rbx,560(%%rdi)\n mov %%rbp,568(%%rdi)\n mov %%r12,576(%%rdi)\n"
		"mov %%r13,584(%%rdi)\n mov %%r14,592(%%rdi)\n mov %%r15,600(%%rdi)\n"
		"movdqu %%xmm0,256(%%rdi)\n movdqu %%xmm1,272(%%rdi)\n movdqu %%xmm2,288(%%rdi)\n movdqu %%xmm3,304(%%rdi)\n"
		"movdqu %%xmm4,320(%%rdi)\n movdqu %%xmm5,336(%%rdi)\n movdqu %%xmm6,352(%%rdi)\n movdqu %%xmm7,368(%%rdi)\n"
		"movdqu %%xmm8,384(%%rdi)\n movdqu %%xmm9,400(%%rdi)\n movdqu %%xmm10,416(%%rdi)\n movdqu %%xmm11,432(%%rdi)\n"
		"movdqu %%xmm12,448(%%rdi)\n movdqu %%xmm13,464(%%rdi)\n movdqu %%xmm14,480(%%rdi)\n movdqu %%xmm15,496(%%rdi)\n"
		"pop %%rbp\n"
		:
		: "D"(&c)
		: "rax", "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "rbx", "r12", "r13", "r14", "r15", "memory",
		  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
		  "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
	if (spoil)
		c.xout[3][0] ^= 1;
	u64 bad = 0;
	for (int i = 0; i < 16; i++)
		if (c.xin[i][0] != c.xout[i][0] || c.xin[i][1] != c.xout[i][1])
			bad |= 1UL << i;
	for (int i = 0; i < 6; i++)
		if (c.gin[i] != c.gout[i])
			bad |= 1UL << (16 + i);
	return bad;
}

static void report(u64 id, u64 it, const char *what)
{
	put("process ");
	putnum(id);
	put(" iteration ");
	putnum(it);
	put(": ");
	put(what);
}

/* child runs process id's checks; it returns its exit status. */
static int child(u64 id, u64 iters, int corrupt)
{
	long p = sys6(SYS_mmap, (long)PAGES, WORDS * 8, 3 /* RW */,
		      0x32 /* PRIVATE|FIXED|ANONYMOUS */, -1, 0);
	if (p != (long)PAGES) {
		report(id, 0, "mmap failed\n");
		return 2;
	}
	for (u64 i = 0; i < WORDS; i++)
		PAGES[i] = id << 32 | i;
	u64 errs = 0;
	for (u64 it = 0; it < iters && errs < 5; it++) {
		int spoil = corrupt && id == 1 && it == 10;
		u64 bad = syscall_regs(id * 100000 + it, it & 1 ? SYS_sched_yield : SYS_getpid, spoil);
		if (bad) {
			report(id, it, "registers changed across a system call, mask ");
			puthex(bad);
			put("\n");
			errs++;
		}
		if (spoil)
			PAGES[7] ^= 1UL << 40;
		for (u64 i = 0; i < WORDS; i++) {
			u64 want = id << 32 | ((i + it) & 0xffffffff);
			if (PAGES[i] != want) {
				report(id, it, "word ");
				putnum(i);
				put(" is ");
				puthex(PAGES[i]);
				put(", want ");
				puthex(want);
				put("\n");
				errs++;
				break;
			}
			PAGES[i] = id << 32 | ((i + it + 1) & 0xffffffff);
		}
	}
	return errs ? 1 : 0;
}

void procstress_main(long *sp)
{
	long argc = sp[0];
	char **argv = (char **)(sp + 1);
	u64 n = argc > 1 ? atou(argv[1]) : 16;
	u64 iters = argc > 2 ? atou(argv[2]) : 2000;
	int corrupt = argc > 3 && argv[3][0] == 'c';
	for (u64 i = 0; i < n; i++) {
		long pid = sys6(SYS_fork, 0, 0, 0, 0, 0, 0);
		if (pid == 0)
			sys6(SYS_exit, child(i + 1, iters, corrupt), 0, 0, 0, 0, 0);
		if (pid < 0) {
			put("fork failed\n");
			sys6(SYS_exit, 3, 0, 0, 0, 0, 0);
		}
	}
	u64 failed = 0, reaped = 0;
	for (; reaped < n; reaped++) {
		int st = 0;
		if (sys6(SYS_wait4, -1, (long)&st, 0, 0, 0, 0) < 0)
			break;
		if (st != 0)
			failed++;
	}
	failed += n - reaped;
	put("processes ");
	putnum(n);
	put(", iterations ");
	putnum(iters);
	put(", failed ");
	putnum(failed);
	put("\n");
	sys6(SYS_exit, failed ? 1 : 0, 0, 0, 0, 0, 0);
}

/* The kernel starts us with argc at the stack pointer. */
asm(".globl _start\n"
    "_start:\n"
    "	mov %rsp, %rdi\n"
    "	and $-16, %rsp\n"
    "	call procstress_main\n"
    "	hlt\n");
