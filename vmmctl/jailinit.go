package vmmctl

// JailInitVerb is the warren sub-command of a JailInit.
const JailInitVerb = "jail-init"

// MaxPassFDs is how many descriptors jail-init passes on to the VMM.
const MaxPassFDs = 64

// JailInit is `warren jail-init`: what warren-hostd starts in a confined
// VMM's new namespaces, pid 1 there, which joins the VMM's cgroups,
// starts the VMM (Program with VMM's arguments) and reports its pid on
// ReportFD. Args encodes it; vmmproc.ParseJailInitArgs, which the warren
// binary runs, decodes it.
type JailInit struct {
	// ReportFD is the unix socket jail-init reports the VMM's pid on
	// (--report-fd: 3 or more).
	ReportFD int
	// PassFDs is how many descriptors (ReportFD+1 onwards) jail-init
	// passes on to the VMM at the same numbers (--pass-fds, at most
	// MaxPassFDs).
	PassFDs int
	// NetHelper has jail-init make the family's private networks
	// (--net-helper); Spawn has it start the family's fork children
	// under grants (--spawn), in cgroups under CgroupRoots (--cgroup-root,
	// one per cgroup v1 hierarchy; only with Spawn).
	NetHelper   bool
	Spawn       bool
	CgroupRoots []string
	// Cgroups are the VMM's cgroup directories, which jail-init joins
	// before it starts the VMM (--cgroup, one per hierarchy).
	Cgroups []string
	// Program is the VMM's executable (absolute) and VMM what it runs.
	Program string
	VMM     Launch
}

// Args checks j and encodes it as warren's arguments, the sub-command
// first (`jail-init ... -- PROGRAM run|restore ...`).
func (j JailInit) Args() ([]string, error) {
	e := encoder{verb: JailInitVerb, args: []string{JailInitVerb}}
	if j.ReportFD < 3 {
		e.fail("report descriptor %d: want an inherited one (3 or more)", j.ReportFD)
	}
	if j.PassFDs < 0 || j.PassFDs > MaxPassFDs {
		e.fail("%d descriptors to pass: want 0 to %d", j.PassFDs, MaxPassFDs)
	}
	if len(j.CgroupRoots) > 0 && !j.Spawn {
		e.fail("cgroup roots without --spawn")
	}
	e.int("--report-fd", j.ReportFD)
	if j.PassFDs > 0 {
		e.int("--pass-fds", j.PassFDs)
	}
	e.flag("--net-helper", j.NetHelper)
	e.flag("--spawn", j.Spawn)
	for _, r := range j.CgroupRoots {
		e.abs("--cgroup-root", r)
		e.str("--cgroup-root", r)
	}
	for _, c := range j.Cgroups {
		e.abs("--cgroup", c)
		e.str("--cgroup", c)
	}
	if j.Program == "" {
		e.fail("no program")
	}
	e.abs("program", j.Program)
	vmm, err := j.VMM.Args()
	if err != nil && e.err == nil {
		e.err = err
	}
	e.args = append(e.args, "--")
	e.str("", j.Program)
	e.args = append(e.args, vmm...)
	return e.done()
}
