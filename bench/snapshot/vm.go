package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/bench/qemu"
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// guestArgs are the kernel arguments both guests get besides the base line
// and the host profile's (as in bench/agent).
const guestArgs = "random.trust_cpu=1"

// vm is one VMM under test: booted once, driven through its guest agent
// and its control socket (Warren's API, QEMU's QMP).
type vm struct {
	rig.Guest
	ctl string // control socket: Warren's --api, QEMU's -qmp
	qmp *qemu.QMP
	mt  *memtouch
}

// warrenArgv is `warren run` for the benchmark's guest.
func warrenArgv(c config, vsockPath, api string) []string {
	return c.WarrenArgv(c.memMiB, vsockPath, api, guestArgs)
}

// qemuGuest is QEMU's microvm with the same guest (bench/qemu); restores
// add -incoming to its line.
func qemuGuest(c config) qemu.Guest {
	return qemu.Guest{Binary: c.QEMU, Kernel: c.Kernel, Initramfs: c.Initramfs,
		MemMiB: c.memMiB, CID: c.qemuCID, GuestArgs: guestArgs}
}

func newWarren(c config, dir string) *vm {
	sock, api := dir+"/warren.vsock", dir+"/warren.api"
	return &vm{Guest: rig.Guest{Name: "warren", Argv: warrenArgv(c, sock, api), Client: agentclient.New(sock)}, ctl: api}
}

func newQEMU(c config, dir string) *vm {
	q := dir + "/qemu.qmp"
	return &vm{Guest: rig.Guest{Name: "qemu", Argv: qemu.Argv(qemuGuest(c), q), Client: qemu.AgentClient(uint32(c.qemuCID), nil)}, ctl: q}
}

// waitAgent waits for the ready line and the agent's answer, and for
// QEMU connects QMP.
func (v *vm) waitAgent(timeout time.Duration) error {
	if err := v.Guest.WaitAgent(timeout); err != nil {
		return err
	}
	if v.Name == "qemu" {
		q, err := qemu.DialQMP(v.ctl, 30*time.Second)
		if err != nil {
			return err
		}
		v.qmp = q
		if err := q.UnlimitedBandwidth(); err != nil {
			return err
		}
	}
	return nil
}

func (v *vm) stop() {
	if v.mt != nil {
		v.mt.close()
		v.mt = nil
	}
	if v.qmp != nil {
		v.qmp.Close()
		v.qmp = nil
	}
	v.Client.Close()
	if v.P != nil {
		v.P.Stop(10 * time.Second)
		v.P = nil
	}
}

// warrenSnapshot takes a snapshot of kind ("full" or "incremental") of
// Warren's VM to path through its control API (`warren run --api`).
func (v *vm) warrenSnapshot(path, kind string, timeout time.Duration) (vmmctl.SnapshotReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := vmmctl.Client{Socket: v.ctl}.Snapshot(ctx, vmmctl.SnapshotRequest{Path: path, Kind: vmsnap.Kind(kind)})
	if err != nil {
		return vmmctl.SnapshotReply{}, fmt.Errorf("warren snapshot %s: %w", path, err)
	}
	return *r, nil
}

// qemuMigrate migrates QEMU's VM to file (live, as QMP migrate does),
// waits for it to complete and continues the source VM.
func (v *vm) qemuMigrate(file string, timeout time.Duration) (qemu.Migration, error) {
	return v.qmp.Migrate(file, timeout)
}

// memtouch is the guest program memtouch run through the agent, its stdin
// a pipe the benchmark writes commands to, its stdout read line by line.
type memtouch struct {
	in    *io.PipeWriter
	lines chan string
	done  chan error
}

// startMemtouch starts memtouch holding mib MiB in v's guest and waits
// for it to have filled them.
func (v *vm) startMemtouch(mib int, timeout time.Duration) error {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	m := &memtouch{in: inW, lines: make(chan string, 16), done: make(chan error, 1)}
	go func() {
		_, err := v.Client.Exec(context.Background(), agentwire.ExecRequest{Argv: []string{"memtouch", strconv.Itoa(mib)}, Input: inR}, outW, os.Stderr)
		outW.CloseWithError(io.EOF)
		m.done <- err
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			m.lines <- sc.Text()
		}
		close(m.lines)
	}()
	v.mt = m
	line, err := m.next(timeout)
	if err != nil {
		return fmt.Errorf("%s: memtouch: %w", v.Name, err)
	}
	if line != "ready "+strconv.Itoa(mib) {
		return fmt.Errorf("%s: memtouch said %q", v.Name, line)
	}
	return nil
}

// dirty has memtouch write one byte in each page of its first k MiB.
func (v *vm) dirty(k int, timeout time.Duration) error {
	if _, err := fmt.Fprintf(v.mt.in, "dirty %d\n", k); err != nil {
		return fmt.Errorf("%s: memtouch: %w", v.Name, err)
	}
	line, err := v.mt.next(timeout)
	if err != nil {
		return fmt.Errorf("%s: memtouch: %w", v.Name, err)
	}
	if line != "ok "+strconv.Itoa(k) {
		return fmt.Errorf("%s: memtouch said %q", v.Name, line)
	}
	return nil
}

// next returns memtouch's next output line.
func (m *memtouch) next(timeout time.Duration) (string, error) {
	select {
	case l, ok := <-m.lines:
		if !ok {
			err := <-m.done
			if err == nil {
				err = errors.New("exited")
			}
			m.done <- err
			return "", fmt.Errorf("output ended: %w", err)
		}
		return strings.TrimSpace(l), nil
	case <-time.After(timeout):
		return "", fmt.Errorf("no answer in %s", timeout)
	}
}

// close ends memtouch's input, which makes it exit.
func (m *memtouch) close() { m.in.Close() }
