// Package console drives a guest through its serial console from the host:
// a VMM process (Warren or QEMU) whose stdin and stdout are the guest's
// serial port, with the guest init's debug shell on it. Benchmarks use it
// to run the same guest commands under both VMMs.
package console

import (
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a running VMM process and the console output it produced.
type Proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	cond  *sync.Cond
	out   bytes.Buffer
	from  int // output offset the next Wait searches from
	done  bool
	err   error
	seq   int
	start time.Time
}

// Start runs argv with its stdin and stdout connected to the console.
func Start(argv []string) (*Proc, error) {
	p := &Proc{cmd: exec.Command(argv[0], argv[1:]...)}
	p.cond = sync.NewCond(&p.mu)
	in, err := p.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.stdin = in
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := out.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			if err != nil {
				p.done = true
			}
			p.mu.Unlock()
			p.cond.Broadcast()
			if err != nil {
				p.err = p.cmd.Wait()
				return
			}
		}
	}()
	return p, nil
}

// Pid is the VMM's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Started is when the process was started.
func (p *Proc) Started() time.Time { return p.start }

// Wait blocks until re matches output after the previous match and returns
// the submatches.
func (p *Proc) Wait(re *regexp.Regexp, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, p.cond.Broadcast)
	defer t.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		b := p.out.Bytes()[p.from:]
		if loc := re.FindSubmatchIndex(b); loc != nil {
			var subs []string
			for i := 0; i < len(loc); i += 2 {
				if loc[i] >= 0 {
					subs = append(subs, string(b[loc[i]:loc[i+1]]))
				} else {
					subs = append(subs, "")
				}
			}
			p.from += loc[1]
			return subs, nil
		}
		if p.done {
			return nil, fmt.Errorf("console: process exited (%v) before %q; last output: %q", p.err, re, tailOf(p.out.Bytes()))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("console: %s without %q; last output: %q", timeout, re, tailOf(p.out.Bytes()))
		}
		p.cond.Wait()
	}
}

// Sh runs cmd in the guest shell and returns its output and how long it took
// as seen from the host (command sent to completion marker seen).
func (p *Proc) Sh(cmd string, timeout time.Duration) (string, time.Duration, error) {
	p.seq++
	n := p.seq * 1000
	re := regexp.MustCompile(fmt.Sprintf(`(?s)^(.*?)END-%d-(\d+)`, n+1))
	t0 := time.Now()
	if _, err := fmt.Fprintf(p.stdin, "%s; echo END-$((%d+1))-$?\n", cmd, n); err != nil {
		return "", 0, err
	}
	m, err := p.Wait(re, timeout)
	d := time.Since(t0)
	if err != nil {
		return "", d, err
	}
	out := m[1]
	// Whatever precedes the terminal's echo of the command line (the echo,
	// a prompt, the rest of an earlier line) is not the command's output.
	if i := strings.LastIndex(out, fmt.Sprintf("END-$((%d+1))-$?", n)); i >= 0 {
		out = out[i:]
		if j := strings.IndexByte(out, '\n'); j >= 0 {
			out = out[j+1:]
		} else {
			out = ""
		}
	} else {
		out = strings.TrimLeft(out, "\r\n") // no echo: drop the end of the previous line
	}
	out = strings.ReplaceAll(out, "\r", "")
	if m[2] != "0" {
		return out, d, fmt.Errorf("guest command %q exited %s: %s", cmd, m[2], out)
	}
	return out, d, nil
}

// CPUTime returns the user+system CPU time the process has used so far.
func (p *Proc) CPUTime() (time.Duration, error) { return cpuTime(p.cmd.Process.Pid) }

// Stop ends the process group as a user would: SIGTERM (Warren and QEMU
// both stop their VM and exit), and SIGKILL only if the console has not
// closed after grace. In the nested KVM host, SIGKILLed VMMs were followed
// by L1 stalls.
func (p *Proc) Stop(grace time.Duration) {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	deadline := time.AfterFunc(grace, func() { syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) })
	defer deadline.Stop()
	p.mu.Lock()
	for !p.done {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

// Kill ends the process group.
func (p *Proc) Kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.mu.Lock()
	for !p.done {
		p.cond.Wait()
	}
	p.mu.Unlock()
}

// Output returns everything the console printed.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func tailOf(b []byte) string {
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return string(b)
}
