package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/bench/console"
	"github.com/warrenvm/warren/bench/vsockpeer"
	"github.com/warrenvm/warren/guestinit/agent"
	"github.com/warrenvm/warren/hostd/agentclient"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/boot"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

// guestArgs are the kernel arguments both guests get besides the base line
// and the host profile's (as in bench/agent).
const guestArgs = "random.trust_cpu=1"

// vm is one VMM under test: booted once, driven through its guest agent
// and its control socket (Warren's API, QEMU's QMP).
type vm struct {
	name   string
	argv   []string
	client *agent.Client
	p      *console.Proc
	ctl    string // control socket: Warren's --api, QEMU's -qmp
	qmp    *qmp
	mt     *memtouch
}

// warrenArgv is `warren run` for the benchmark's guest.
func warrenArgv(c config, vsockPath, api string) []string {
	return []string{c.warren, "run", "--kernel", c.kernel, "--initramfs", c.initramfs,
		"--mem", strconv.Itoa(c.memMiB), "--cpus", "1", "--vsock", vsockPath, "--cid", "3",
		"--api", api, "--cmdline", guestArgs}
}

// qemuArgv is QEMU's microvm with the same guest, virtio-rng (Warren gives
// its guests one by default) and the kernel's vhost-vsock; restores add
// -incoming to the same line.
func qemuArgv(c config, qmpPath string) []string {
	var cmd boot.Cmdline // what warren boots with, less its virtio_mmio entries
	cmd.Add(vmm.BaseCmdline)
	cmd.Add(hostprofile.Detect("/sys/module").KernelArgs()...)
	cmd.Add(guestArgs)
	argv := []string{c.qemu, "-M", "microvm,acpi=off", "-accel", "kvm", "-cpu", "host,-arch-capabilities",
		"-m", strconv.Itoa(c.memMiB), "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-monitor", "none",
		"-kernel", c.kernel, "-initrd", c.initramfs, "-append", cmd.String(),
		"-device", "virtio-rng-device",
		"-device", "vhost-vsock-device,guest-cid=" + strconv.Itoa(c.qemuCID)}
	if qmpPath != "" {
		argv = append(argv, "-qmp", "unix:"+qmpPath+",server=on,wait=off")
	}
	return argv
}

func newWarren(c config, dir string) *vm {
	sock, api := dir+"/warren.vsock", dir+"/warren.api"
	return &vm{name: "warren", argv: warrenArgv(c, sock, api), client: agentclient.New(sock), ctl: api}
}

func newQEMU(c config, dir string) *vm {
	q := dir + "/qemu.qmp"
	return &vm{name: "qemu", argv: qemuArgv(c, q), client: qemuClient(uint32(c.qemuCID)), ctl: q}
}

// qemuClient reaches the agent of the QEMU guest with CID cid over AF_VSOCK.
func qemuClient(cid uint32) *agent.Client {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		return vsockpeer.Dial(ctx, cid, agent.Port)
	})
}

var ready = regexp.MustCompile(`warren-init: ready uptime=`)

func (v *vm) start() error {
	p, err := console.Start(v.argv)
	if err != nil {
		return fmt.Errorf("%s: %w", v.name, err)
	}
	v.p = p
	return nil
}

// waitAgent waits for the ready line and the agent's answer, and for
// QEMU connects QMP.
func (v *vm) waitAgent(timeout time.Duration) error {
	if _, err := v.p.Wait(ready, timeout); err != nil {
		return fmt.Errorf("%s: %w", v.name, err)
	}
	if _, err := v.client.WaitHealth(context.Background(), time.Now().Add(timeout), 10*time.Second); err != nil {
		return fmt.Errorf("%s: agent did not answer: %w", v.name, err)
	}
	fmt.Printf("%s: agent answering %s after start\n", v.name, time.Since(v.p.Started()).Round(time.Millisecond))
	if v.name == "qemu" {
		q, err := dialQMP(v.ctl, 30*time.Second)
		if err != nil {
			return err
		}
		v.qmp = q
		// Unlimited bandwidth: QEMU's default (32 MiB/s) would make the
		// migration a throttled transfer rather than a snapshot.
		if _, err := q.call("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
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
		v.qmp.close()
		v.qmp = nil
	}
	v.client.Close()
	if v.p != nil {
		v.p.Kill()
		v.p = nil
	}
}

// snapshotReply is the part of Warren's POST /v1/snapshot answer used.
type snapshotReply struct {
	PauseMS    float64 `json:"pause_ms"`
	TotalMS    float64 `json:"total_ms"`
	Pages      uint64  `json:"pages"`
	LayerBytes int64   `json:"layer_bytes"`
	StateBytes int64   `json:"state_bytes"`
	Layer      string  `json:"layer"`
}

// warrenSnapshot takes a snapshot of kind ("full" or "incremental") of
// Warren's VM to path through its control API (`warren run --api`).
func (v *vm) warrenSnapshot(path, kind string, timeout time.Duration) (snapshotReply, error) {
	var r snapshotReply
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", v.ctl)
		},
	}}
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"path": path, "kind": kind})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://warren/v1/snapshot", bytes.NewReader(body))
	if err != nil {
		return r, err
	}
	res, err := c.Do(req)
	if err != nil {
		return r, fmt.Errorf("warren snapshot: %w", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if res.StatusCode != http.StatusOK {
		return r, fmt.Errorf("warren snapshot %s: %s: %s", path, res.Status, bytes.TrimSpace(b))
	}
	return r, json.Unmarshal(b, &r)
}

// migration is one QEMU migration to a file.
type migration struct {
	downtime, total time.Duration
	bytes           int64
	ram             map[string]any
}

// qemuMigrate migrates QEMU's VM to file (live, as QMP migrate does),
// waits for it to complete and continues the source VM.
func (v *vm) qemuMigrate(file string, timeout time.Duration) (migration, error) {
	var m migration
	os.Remove(file)
	if _, err := v.qmp.call("migrate", map[string]any{"uri": "exec:cat > " + file}); err != nil {
		return m, err
	}
	deadline := time.Now().Add(timeout)
	for {
		raw, err := v.qmp.call("query-migrate", nil)
		if err != nil {
			return m, err
		}
		var st struct {
			Status    string         `json:"status"`
			Downtime  int64          `json:"downtime"`
			TotalTime int64          `json:"total-time"`
			Error     string         `json:"error-desc"`
			RAM       map[string]any `json:"ram"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return m, err
		}
		switch {
		case st.Status == "completed" && st.TotalTime > 0: // 0: the previous migration's status, not yet reset
			m.downtime, m.total = time.Duration(st.Downtime)*time.Millisecond, time.Duration(st.TotalTime)*time.Millisecond
			m.ram = st.RAM
			// cat may still be writing what QEMU sent: wait until the
			// file's size holds still.
			for m.bytes = -1; ; time.Sleep(20 * time.Millisecond) {
				fi, err := os.Stat(file)
				if err != nil {
					return m, err
				}
				if fi.Size() == m.bytes {
					break
				}
				m.bytes = fi.Size()
			}
			if _, err := v.qmp.call("cont", nil); err != nil {
				return m, fmt.Errorf("qemu: cont after migration: %w", err)
			}
			return m, nil
		case st.Status == "failed" || st.Status == "cancelled":
			return m, fmt.Errorf("qemu: migration %s: %s", st.Status, st.Error)
		}
		if time.Now().After(deadline) {
			return m, fmt.Errorf("qemu: migration still %q after %s", st.Status, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// qmp is a minimal QMP client: one command at a time, events skipped.
type qmp struct {
	c net.Conn
	r *bufio.Reader
}

// dialQMP connects to QEMU's QMP socket and leaves capability negotiation.
func dialQMP(path string, timeout time.Duration) (*qmp, error) {
	deadline := time.Now().Add(timeout)
	var c net.Conn
	var err error
	for {
		if c, err = net.Dial("unix", path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("qmp %s: %w", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	q := &qmp{c: c, r: bufio.NewReader(c)}
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		c.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	if _, err := q.call("qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

// call executes cmd with args (nil: none) and returns its "return" value.
func (q *qmp) call(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qmp %s: %q: %w", cmd, line, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, resp.Error.Class, resp.Error.Desc)
		}
		return resp.Return, nil
	}
}

func (q *qmp) close() { q.c.Close() }

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
		_, err := v.client.Exec(context.Background(), agent.ExecRequest{Argv: []string{"memtouch", strconv.Itoa(mib)}, Input: inR}, outW, os.Stderr)
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
		return fmt.Errorf("%s: memtouch: %w", v.name, err)
	}
	if line != "ready "+strconv.Itoa(mib) {
		return fmt.Errorf("%s: memtouch said %q", v.name, line)
	}
	return nil
}

// dirty has memtouch write one byte in each page of its first k MiB.
func (v *vm) dirty(k int, timeout time.Duration) error {
	if _, err := fmt.Fprintf(v.mt.in, "dirty %d\n", k); err != nil {
		return fmt.Errorf("%s: memtouch: %w", v.name, err)
	}
	line, err := v.mt.next(timeout)
	if err != nil {
		return fmt.Errorf("%s: memtouch: %w", v.name, err)
	}
	if line != "ok "+strconv.Itoa(k) {
		return fmt.Errorf("%s: memtouch said %q", v.name, line)
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
