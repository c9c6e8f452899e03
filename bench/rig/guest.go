package rig

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/bench/console"
)

// Ready matches the line a benchmark guest's init prints once it is up.
var Ready = regexp.MustCompile(`warren-init: ready uptime=`)

// WarrenArgv is `warren run` of f's kernel and initramfs with one vCPU and
// memMiB MiB, its vsock device's socket at vsock (guest CID 3), the API
// socket at api unless it is "", and args on the guest's command line.
func (f Files) WarrenArgv(memMiB int, vsock, api, args string) []string {
	argv := []string{f.Warren, "run", "--kernel", f.Kernel, "--initramfs", f.Initramfs,
		"--mem", strconv.Itoa(memMiB), "--cpus", "1", "--vsock", vsock, "--cid", "3"}
	if api != "" {
		argv = append(argv, "--api", api)
	}
	return append(argv, "--cmdline", args)
}

// Guest is a benchmark guest: its VMM's command line, the VMM on a
// console once started, and the client of the guest's agent.
type Guest struct {
	// Name names it in errors and output ("warren", "qemu").
	Name   string
	Argv   []string
	Client *agentclient.Client
	P      *console.Proc
}

// Start starts the guest's VMM on a console (bench/console).
func (g *Guest) Start() error {
	p, err := console.Start(g.Argv)
	if err != nil {
		return fmt.Errorf("%s: %w", g.Name, err)
	}
	g.P = p
	return nil
}

// WaitAgent waits up to timeout for the guest to be up and its agent to
// answer (the function WaitAgent).
func (g *Guest) WaitAgent(timeout time.Duration) error {
	return WaitAgent(g.Name, g.P, g.Client, timeout)
}

// WaitAgent waits up to timeout for the guest on p's console to print
// Ready and then for its agent to answer client, and prints how long
// after p's start it did; name names the guest in errors and output.
func WaitAgent(name string, p *console.Proc, client *agentclient.Client, timeout time.Duration) error {
	if _, err := p.Wait(Ready, timeout); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if _, err := client.WaitHealth(context.Background(), time.Now().Add(timeout), 10*time.Second); err != nil {
		return fmt.Errorf("%s: agent did not answer: %w", name, err)
	}
	fmt.Printf("%s: agent answering %s after start\n", name, time.Since(p.Started()).Round(time.Millisecond))
	return nil
}

// Group is a process started in a process group of its own (so that it
// stops with its children) with its output captured.
type Group struct {
	Cmd *exec.Cmd
	// Out is its stdout and stderr, whole once Exited is closed.
	Out bytes.Buffer
	// Exited is closed once the process has exited.
	Exited chan struct{}
	// Started is when it was started.
	Started time.Time
}

// StartGroup starts argv as a Group.
func StartGroup(argv []string) (*Group, error) {
	g := &Group{Cmd: exec.Command(argv[0], argv[1:]...), Exited: make(chan struct{})}
	g.Cmd.Stdout, g.Cmd.Stderr = &g.Out, &g.Out
	g.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	g.Started = time.Now()
	if err := g.Cmd.Start(); err != nil {
		return nil, err
	}
	go func() { g.Cmd.Wait(); close(g.Exited) }()
	return g, nil
}
