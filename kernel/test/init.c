// Test PID 1 for Warren's guest kernel (kernel/test/qemu-smoke.sh).
//
// Reports boot facts on the console, then - when the kernel command line has
// warren_lstar=<address of entry_SYSCALL_64> - exercises the kernel's
// "warren_pvm_native" SYSCALL completion path: it imitates what a PVM-native
// host does with a SYSCALL (RIP = LSTAR, RCX = return RIP, R11 = RFLAGS, still
// in user mode) by jumping to entry_SYSCALL_64 from user mode. The kernel
// sees a user #PF at address == RIP == LSTAR. With warren_pvm_native it must
// complete the system call; without it the process gets SIGSEGV (stock).
// Finally it execs /stage2.sh (busybox sh), which reboots the machine.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/reboot.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

unsigned long warren_lstar; // entry_SYSCALL_64, from warren_lstar= in the env

// A "SYSCALL" as a PVM-native host executes it. The real 2-byte `syscall`
// just before label 1 is where a restarted call resumes (ip = rcx - 2).
static long fake_syscall(long nr, long a1, long a2, long a3, long a4, long a5, long a6)
{
	register long r10 __asm__("r10") = a4;
	register long r8 __asm__("r8") = a5;
	register long r9 __asm__("r9") = a6;
	long ret;
	__asm__ volatile(
		"lea 1f(%%rip), %%rcx\n\t"
		"pushfq\n\t"
		"pop %%r11\n\t"
		"jmp *warren_lstar(%%rip)\n\t"
		"syscall\n"
		"1:"
		: "=a"(ret)
		: "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
		: "rcx", "r11", "memory");
	return ret;
}

// Signal return through the imitated SYSCALL (rt_sigreturn = 15).
__asm__(".text\n"
	"fake_restorer:\n\t"
	"mov $15, %eax\n\t"
	"lea 1f(%rip), %rcx\n\t"
	"pushfq\n\t"
	"pop %r11\n\t"
	"jmp *warren_lstar(%rip)\n"
	"1:\tud2\n");
void fake_restorer(void);

static double uptime(void)
{
	char buf[64] = {0};
	int fd = open("/proc/uptime", O_RDONLY);
	if (fd < 0)
		return -1;
	read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return atof(buf);
}

static int failures;
#define CHECK(cond, what)                                                      \
	do {                                                                   \
		if (cond)                                                      \
			printf("WARREN-TEST ok   %s\n", what);                 \
		else {                                                         \
			printf("WARREN-TEST FAIL %s (errno %d)\n", what, errno); \
			failures++;                                            \
		}                                                              \
		fflush(stdout);                                                \
	} while (0)

static int pipefd[2];
static volatile int alarm_seen, usr1_seen;
static void on_alarm(int sig) { (void)sig; alarm_seen = 1; write(pipefd[1], "x", 1); }
static void on_usr1(int sig) { (void)sig; usr1_seen = 1; }

static void fake_tests(int flag)
{
	// Probe in a child first: without the flag this must be SIGSEGV.
	pid_t pid = fork();
	if (pid == 0) {
		long r = fake_syscall(SYS_getpid, 0, 0, 0, 0, 0, 0);
		_exit(r == getpid() ? 0 : 1);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	if (!flag) {
		CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
		      "without warren_pvm_native the imitated SYSCALL is a SIGSEGV (stock)");
		return;
	}
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "imitated getpid in a child");

	CHECK(fake_syscall(SYS_getpid, 0, 0, 0, 0, 0, 0) == 1, "imitated getpid == 1");
	static const char msg[] = "WARREN-TEST (this line written by an imitated write)\n";
	CHECK(fake_syscall(SYS_write, 1, (long)msg, sizeof(msg) - 1, 0, 0, 0) == sizeof(msg) - 1,
	      "imitated write");
	CHECK(fake_syscall(999, 0, 0, 0, 0, 0, 0) == -ENOSYS, "imitated syscall 999 == -ENOSYS");
	CHECK(fake_syscall(-1, 0, 0, 0, 0, 0, 0) == -ENOSYS, "imitated syscall -1 == -ENOSYS");

	// fork through the imitated path: the child leaves via ret_from_fork.
	long c = fake_syscall(SYS_fork, 0, 0, 0, 0, 0, 0);
	if (c == 0) {
		static const char cm[] = "WARREN-TEST (child of imitated fork here)\n";
		fake_syscall(SYS_write, 1, (long)cm, sizeof(cm) - 1, 0, 0, 0);
		fake_syscall(SYS_exit_group, 42, 0, 0, 0, 0, 0);
		for (;;)
			;
	}
	st = 0;
	waitpid(c, &st, 0);
	CHECK(c > 1 && WIFEXITED(st) && WEXITSTATUS(st) == 42, "imitated fork + exit_group(42)");

	// Restart: read() blocks, SIGALRM (SA_RESTART) interrupts it, the handler
	// fills the pipe; the kernel rewinds ip by 2 onto the real syscall.
	pipe(pipefd);
	struct sigaction sa = {0};
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	alarm(1);
	char b = 0;
	long n = fake_syscall(SYS_read, pipefd[0], (long)&b, 1, 0, 0, 0);
	CHECK(alarm_seen && n == 1 && b == 'x', "imitated read restarted after SA_RESTART signal");

	// User space controls RCX/R11 when it jumps to entry_SYSCALL_64 itself:
	// IOPL bits in R11 must not survive (cli must still fault), and a
	// non-canonical RCX must end in a signal, not in a kernel oops.
	pid = fork();
	if (pid == 0) {
		__asm__ volatile("mov $39, %%eax\n\t"
				 "lea 1f(%%rip), %%rcx\n\t"
				 "pushfq\n\t"
				 "pop %%r11\n\t"
				 "or $0x3000, %%r11\n\t"
				 "jmp *warren_lstar(%%rip)\n"
				 "1:\tcli\n\t"
				 "sti\n\t"
				 ::: "rax", "rcx", "r11", "memory");
		_exit(0); // cli worked: IOPL 3 leaked
	}
	st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "IOPL from R11 not taken over (cli faults)");
	pid = fork();
	if (pid == 0) {
		__asm__ volatile("mov $39, %%eax\n\t"
				 "movabs $0x8000000000000000, %%rcx\n\t"
				 "pushfq\n\t"
				 "pop %%r11\n\t"
				 "jmp *warren_lstar(%%rip)\n"
				 ::: "rax", "rcx", "r11", "memory");
		_exit(0);
	}
	st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFSIGNALED(st), "non-canonical RCX ends in a signal");
	if (WIFSIGNALED(st))
		printf("WARREN-TEST      (signal %d)\n", WTERMSIG(st));

	// rt_sigreturn through the imitated path (raw rt_sigaction, own restorer).
	struct { void *h; unsigned long flags; void *restorer; unsigned long mask; } ksa = {
		(void *)on_usr1, 0x04000000 /* SA_RESTORER */, (void *)fake_restorer, 0};
	CHECK(syscall(SYS_rt_sigaction, SIGUSR1, &ksa, NULL, 8) == 0, "rt_sigaction with own restorer");
	volatile long keep = 0x5eed;
	fake_syscall(SYS_kill, getpid(), SIGUSR1, 0, 0, 0, 0);
	CHECK(usr1_seen && keep == 0x5eed, "signal handler returned via imitated rt_sigreturn");
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "stage2") == 0) {
		printf("WARREN-TEST ok   imitated execve reached stage2\n");
		fflush(stdout);
		char *sargv[] = {"/stage2.sh", NULL};
		execve("/stage2.sh", sargv, (char *[]){"PATH=/bin", NULL});
		printf("WARREN-TEST FAIL exec /stage2.sh: %s\n", strerror(errno));
		reboot(RB_AUTOBOOT);
		return 1;
	}
	mkdir("/proc", 0755);
	mkdir("/sys", 0755);
	mount("proc", "/proc", "proc", 0, NULL);
	mount("sysfs", "/sys", "sysfs", 0, NULL);

	cpu_set_t set;
	sched_getaffinity(0, sizeof(set), &set);
	char cmdline[1024] = {0};
	int fd = open("/proc/cmdline", O_RDONLY);
	read(fd, cmdline, sizeof(cmdline) - 1);
	close(fd);
	printf("WARREN-INIT hello from PID %d at uptime %.2f s, %d CPU(s) online\n", getpid(), uptime(),
	       CPU_COUNT(&set));
	printf("WARREN-INIT cmdline: %s", cmdline);
	fflush(stdout);

	char *l = getenv("warren_lstar");
	int flag = strstr(cmdline, "warren_pvm_native") != NULL;
	if (l) {
		warren_lstar = strtoul(l, NULL, 0);
		fake_tests(flag);
		printf("WARREN-TEST summary: %d failure(s)\n", failures);
		fflush(stdout);
		if (flag) {
			char *eargv[] = {"/init", "stage2", NULL};
			fake_syscall(SYS_execve, (long)"/init", (long)eargv, (long)(char *[]){NULL}, 0, 0, 0);
			printf("WARREN-TEST FAIL imitated execve returned\n");
		}
	}
	char *sargv[] = {"/stage2.sh", NULL};
	execve("/stage2.sh", sargv, (char *[]){"PATH=/bin", NULL});
	printf("WARREN-INIT exec /stage2.sh failed: %s\n", strerror(errno));
	reboot(RB_AUTOBOOT);
	return 1;
}
