package vmmproc

import (
	"os"
	"sync"

	"github.com/warrenvm/warren/vmmproc/jail"
)

// process is what this VMM process is, as far as its jail, its network
// and its forks care: learned once as it starts (Run and Restore from
// their environment, ForkChild from its spec) and then passed down, in
// vmOptions.proc and apiServer.proc, instead of kept in package
// variables, so that a test states the process it means. A nil *process
// is a plain VMM: not a fork child, no family helper.
type process struct {
	// forkChild is set for `warren fork-child`: it inherits its parent's
	// jail and mount namespace.
	forkChild bool
	// helper is the family's helper socket (nil: none, the process makes
	// its network and its children itself): from $jail.HelperEnv for run
	// and restore under jail-init, from the fork spec for a fork child.
	helper *os.File
	// spawns is set when the children are started by the family's
	// jail-init (jail.SpawnEnv with a helper) rather than by this process.
	spawns bool
	// exe is the program fork children are started from; "" until
	// needed, then fixed (enterJail fixes it before the jail's root
	// hides the path /proc/self/exe resolves through).
	exe string

	// mu guards jail, the jail entered (fork children are started with
	// it); the API's goroutines read it.
	mu   sync.Mutex
	jail JailSpec
}

// newProcess is the process of `warren run` or `warren restore`: its
// family's helper socket, if jail-init passed one, and whether that
// jail-init starts the children.
func newProcess() (*process, error) {
	helper, err := jail.HelperFromEnv()
	if err != nil {
		return nil, err
	}
	return newProcessWith(helper, false), nil
}

// newForkChildProcess is the process of `warren fork-child`, with the
// helper socket its spec passed (nil: none).
func newForkChildProcess(helper *os.File) *process { return newProcessWith(helper, true) }

// newProcessWith is a process with helper (nil: none) whose children its
// jail-init starts when $jail.SpawnEnv says so.
func newProcessWith(helper *os.File, forkChild bool) *process {
	return &process{forkChild: forkChild, helper: helper, spawns: helper != nil && os.Getenv(jail.SpawnEnv) == "1"}
}

// isForkChild reports whether p is a fork child.
func (p *process) isForkChild() bool { return p != nil && p.forkChild }

// helperConn is p's family helper socket (nil: none).
func (p *process) helperConn() *os.File {
	if p == nil {
		return nil
	}
	return p.helper
}

// spawnsViaHelper reports whether p's fork children are started by its
// family's helper (jail-init with --spawn: the VMM was told so in
// jail.SpawnEnv) rather than by p.
func (p *process) spawnsViaHelper() bool { return p != nil && p.helper != nil && p.spawns }

// selfExe names the running executable's own file: exec'd, it runs this
// very binary (the kernel opens the file the process was started from),
// whatever has happened to the path it was started by since.
const selfExe = "/proc/self/exe"

// executable is the program p's fork children are started from: the
// running executable itself (selfExe), so that a child runs the code that
// wrote its spec even when a new warren binary was renamed over the
// parent's path meanwhile (an upgrade; make's build_bin), or, in a jail
// whose root hides /proc, the path fixExecutable resolved before it
// (tests run their own binary, which dispatches fork-child). A binary
// rewritten in place is another matter: a local file system refuses that
// while it runs (ETXTBSY), and over the nested host's 9p mount it leaves
// a mix of old and new pages that no path choice avoids.
func (p *process) executable() (string, error) {
	if p != nil && p.exe != "" {
		return p.exe, nil
	}
	if _, err := os.Stat(selfExe); err == nil {
		return selfExe, nil
	}
	return os.Executable()
}

// fixExecutable resolves p's executable now and keeps it.
func (p *process) fixExecutable() {
	if p == nil {
		return
	}
	if exe, err := os.Executable(); err == nil {
		p.exe = exe
	}
}

// setJail records the jail p entered.
func (p *process) setJail(j JailSpec) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.jail = j
}

// currentJail is the jail p entered, as --jail spells it ("" for none).
func (p *process) currentJail() string {
	if p == nil {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.jail.String()
}
