package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/bench/agentdial"
	"github.com/warrenvm/warren/bench/console"
	"github.com/warrenvm/warren/bench/proc"
	"github.com/warrenvm/warren/bench/qemu"
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/vsockpeer"
	"github.com/warrenvm/warren/vmm/testguest"
)

// guestArgs are the kernel arguments both guests get besides the base line
// and the host profile's (as in bench/snapshot and bench/fork): the
// template gets them as its cmdline.
const guestArgs = "random.trust_cpu=1"

// qemuPeer restores QEMU -M microvm guests from one migration file of the
// same kernel+initramfs guest, as bench/fork clones QEMU: each restore is
// a new `qemu -incoming "exec:cat FILE"` with a fresh guest CID, timed
// from process start to its agent's first answer over AF_VSOCK.
type qemuPeer struct {
	c         config
	file      string
	cid       atomic.Int64
	sync      net.Listener
	fileBytes int64
	downtime  time.Duration
}

// newQEMUPeer boots the source guest (its QMP socket in work), waits for
// its agent, migrates it to a file in data and stops it.
func newQEMUPeer(c config, work, data string) (*qemuPeer, error) {
	q := &qemuPeer{c: c, file: filepath.Join(data, "qemu.mig")}
	q.cid.Store(int64(c.qemuCID))
	l, err := vsockpeer.ServeSync()
	if err != nil {
		return nil, err
	}
	q.sync = l
	g := q.guest(c.qemuCID)
	qmpPath := filepath.Join(work, "qemu.qmp")
	p, err := console.Start(qemu.Argv(g, qmpPath))
	if err != nil {
		q.close()
		return nil, fmt.Errorf("qemu: %w", err)
	}
	defer p.Stop(10 * time.Second)
	fail := func(err error) (*qemuPeer, error) {
		q.close()
		return nil, fmt.Errorf("qemu source guest: %w; console: %s", err, tail(p.Output()))
	}
	if _, err := p.Wait(rig.Ready, c.timeout); err != nil {
		return fail(err)
	}
	client := qemu.AgentClient(uint32(c.qemuCID), nil)
	defer client.Close()
	if _, err := client.WaitHealth(context.Background(), time.Now().Add(c.timeout), 10*time.Second); err != nil {
		return fail(fmt.Errorf("agent did not answer: %w", err))
	}
	fmt.Printf("qemu: source guest's agent answering %s after start\n", time.Since(p.Started()).Round(time.Millisecond))
	qmp, err := qemu.DialQMP(qmpPath, 30*time.Second)
	if err != nil {
		return fail(err)
	}
	defer qmp.Close()
	if err := qmp.UnlimitedBandwidth(); err != nil {
		return fail(err)
	}
	m, err := qmp.Migrate(q.file, c.timeout)
	if err != nil {
		return fail(err)
	}
	q.fileBytes, q.downtime = m.Bytes, m.Downtime
	fmt.Printf("qemu: migrated to a file once: downtime %s, total %s, %.1f MiB\n", m.Downtime, m.Total, float64(m.Bytes)/(1<<20))
	return q, nil
}

func (q *qemuPeer) guest(cid int) qemu.Guest {
	return qemu.Guest{Binary: q.c.qemu, Kernel: q.c.kernel, Initramfs: q.c.initramfs, MemMiB: q.c.memMiB, CID: cid, GuestArgs: guestArgs}
}

func (q *qemuPeer) close() {
	if q.sync != nil {
		q.sync.Close()
	}
}

// restore starts a QEMU from the migration file, returns process start to
// its agent's first answer, and stops it (SIGTERM, SIGKILL after 10 s)
// after the timing.
func (q *qemuPeer) restore(ctx context.Context) (time.Duration, error) {
	return q.start(ctx, false)
}

// tti is restore's time to interactive: from process start to the end of
// the agent's answer to its first exec (true).
func (q *qemuPeer) tti(ctx context.Context) (time.Duration, error) {
	return q.start(ctx, true)
}

// start is restore, and with firstExec tti.
func (q *qemuPeer) start(ctx context.Context, firstExec bool) (time.Duration, error) {
	cid := int(q.cid.Add(1)) // a fresh CID for each restore, as bench/fork does
	argv := append(qemu.Argv(q.guest(cid), ""), "-incoming", "exec:cat "+q.file)
	client := qemu.AgentClient(uint32(cid), agentdial.Racing)
	defer client.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	var out testguest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	exited := make(chan struct{})
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	go func() { cmd.Wait(); close(exited) }()
	defer proc.StopGroup(cmd.Process.Pid, exited, "qemu")
	deadline := start.Add(q.c.createTimeout)
	for {
		c, cancel := context.WithDeadline(ctx, deadline)
		_, err := client.Health(c)
		if err == nil && firstExec {
			var code int
			if code, err = client.Exec(c, agentwire.ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard); err == nil && code != 0 {
				cancel()
				return 0, fmt.Errorf("exec true: exit %d", code)
			}
		}
		cancel()
		if err == nil {
			return time.Since(start), nil
		}
		select {
		case <-exited:
			return 0, fmt.Errorf("qemu exited: %s", tail(out.String()))
		default:
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("agent did not answer in %s: %w; output: %s", q.c.createTimeout, err, tail(out.String()))
		}
		time.Sleep(time.Millisecond)
	}
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 800 {
		s = "..." + s[len(s)-800:]
	}
	return s
}
