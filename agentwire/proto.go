package agentwire

import (
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"time"
)

// Version is the agent version reported by /health.
const Version = "0.1.0"

// Frame types of the /exec response stream.
const (
	// FrameStdout carries a chunk of the process's standard output.
	FrameStdout byte = 1
	// FrameStderr carries a chunk of the process's standard error.
	FrameStderr byte = 2
	// FrameExit ends the stream; its payload is a JSON ExitStatus.
	FrameExit byte = 3
	// FrameError ends the stream; its payload is a JSON Error.
	FrameError byte = 4
)

// Vsock ports. The agent listens on Port in the guest; the host serves
// the clock and RNG re-sync protocol (see SyncMessage; agentclient has the
// host's side) on SyncPort, which the guest dials at the host's CID (2).
const (
	// Port is the agent's vsock listen port in the guest.
	Port uint32 = 1024
	// SyncPort is the host's re-sync service port.
	SyncPort uint32 = 1025
)

// MaxFrame is the largest frame payload a reader accepts.
const MaxFrame = 1 << 20

// ModeHeader is the response header of GET /files holding the file's
// permission bits in octal.
const ModeHeader = "X-Warren-Mode"

// PidHeader is the response header of POST /exec holding the started
// process's pid (also its process group id), for POST /kill.
const PidHeader = "X-Warren-Pid"

// AgentTimeHeader is the response header of GET /health holding the
// handler's own time in the guest, in decimal nanoseconds: from the
// handler's start to the response body ready to write. Benchmarks subtract
// it from a round trip to see the transport's share (see agentclient's
// Client.HealthTimed).
const AgentTimeHeader = "X-Warren-Agent-Ns"

// ExecRequest asks the agent to run a process.
type ExecRequest struct {
	// Argv is the program and its arguments; Argv[0] without a slash is
	// looked up in PATH (the PATH of the resulting environment), and the
	// process sees the path it was found at as its argv[0].
	Argv []string `json:"argv"`
	// Env entries (KEY=VALUE) are added to the agent's environment,
	// replacing variables of the same name.
	Env []string `json:"env,omitempty"`
	// Cwd is the working directory; empty means the agent's default (the
	// image's WorkingDir in an image root, else the agent's own).
	Cwd string `json:"cwd,omitempty"`
	// User is who the process runs as: "name", "uid", "name:group" or
	// "uid:gid", resolved against the guest's /etc/passwd and /etc/group
	// (see package guestinit/etc); empty means the agent's default (the
	// image's User in an image root, else the agent's own, root). "root"
	// is root in any image.
	User string `json:"user,omitempty"`
	// TimeoutMS, when positive, kills the process group after that many
	// milliseconds.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin says that the request body after the JSON line is the
	// process's standard input; otherwise stdin is /dev/null.
	Stdin bool `json:"stdin,omitempty"`

	// Input is the client-side source of standard input; the client
	// (agentclient) sets Stdin when it is non-nil. It is not sent as JSON.
	Input io.Reader `json:"-"`
	// OnStart, when non-nil, is called by the client with the process's
	// pid once the agent has started it, before any output is copied.
	// It is not sent as JSON.
	OnStart func(pid int) `json:"-"`
}

// ExitStatus is the payload of FrameExit.
type ExitStatus struct {
	// Code is the exit code, or 128+signal number if a signal killed the
	// process (as shells report it).
	Code int `json:"code"`
	// Signal names the signal that killed the process, if any.
	Signal string `json:"signal,omitempty"`
	// TimedOut says the agent killed the process at its timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// AgentNs is the agent's own time for the request in the guest, in
	// nanoseconds: from the request line decoded to this status ready
	// (looking up the program, fork and exec, the wait, draining its
	// output). Benchmarks subtract it from a round trip (see agentclient's
	// Client.ExecStatus); 0 from an agent that does not measure it.
	AgentNs int64 `json:"agent_ns,omitempty"`
}

// Health is the /health response.
type Health struct {
	// Version is the agent version.
	Version string `json:"version"`
	// UptimeSeconds is the guest's uptime from /proc/uptime.
	UptimeSeconds float64 `json:"uptime_seconds"`
	// AgentUptimeSeconds is how long the agent's server has existed.
	AgentUptimeSeconds float64 `json:"agent_uptime_seconds"`
	// Load is the 1, 5 and 15 minute load averages from /proc/loadavg.
	Load [3]float64 `json:"load"`
	// MemTotalBytes is MemTotal from /proc/meminfo.
	MemTotalBytes uint64 `json:"mem_total_bytes"`
	// MemFreeBytes is MemFree from /proc/meminfo.
	MemFreeBytes uint64 `json:"mem_free_bytes"`
	// MemAvailableBytes is MemAvailable from /proc/meminfo.
	MemAvailableBytes uint64 `json:"mem_available_bytes"`
	// Syncs is how many clock and RNG re-syncs the guest has applied
	// (one at boot, one after each snapshot restore or fork).
	Syncs uint64 `json:"syncs"`
	// LastSync is when the last re-sync was applied (guest clock, after
	// setting it); zero if none was.
	LastSync time.Time `json:"last_sync,omitzero"`
	// Hostname is the guest's hostname and MachineID the content of
	// /etc/machine-id ("" when absent): a forked child's differ from its
	// parent's once it has synced.
	Hostname  string `json:"hostname,omitempty"`
	MachineID string `json:"machine_id,omitempty"`
	// Services are the supervised services (POST /services), by name.
	Services []ServiceStatus `json:"services,omitempty"`
}

// ServiceSpec asks the agent to run a supervised service (POST
// /services): a process tied to no request, restarted whenever it exits
// (waiting MinServiceBackoff, doubling up to MaxServiceBackoff after runs
// shorter than ServiceResetAfter), its standard output and error appended
// to a log in the guest (ServiceStatus.Log, rotated at MaxServiceLog).
type ServiceSpec struct {
	// Name names the service: 1 to 64 letters, digits, '.', '_' or '-',
	// starting with a letter or digit. It also names the log file.
	Name string `json:"name"`
	// Argv, Env, Cwd and User are as in ExecRequest; they are resolved
	// again at every restart (the user's entry, the agent's environment).
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	User string   `json:"user,omitempty"`
}

// Service states (ServiceStatus.State).
const (
	// ServiceRunning: the process is running.
	ServiceRunning = "running"
	// ServiceBackoff: the process exited (or failed to start) and the
	// agent waits before starting it again.
	ServiceBackoff = "backoff"
	// ServiceStopped: the service was stopped (DELETE /services) and is
	// not restarted.
	ServiceStopped = "stopped"
)

// Limits and timings of services.
const (
	// MaxServices bounds the services an agent supervises at once.
	MaxServices = 64
	// MaxServiceLog is the size at which a service's log is rotated: the
	// log is renamed to LOG.1 (replacing the previous one) and a new one
	// started, so a service keeps at most twice this much on disk.
	MaxServiceLog = 4 << 20
	// MinServiceBackoff and MaxServiceBackoff bound the wait before a
	// restart; ServiceResetAfter is how long a run must last for the
	// next restart to wait MinServiceBackoff again.
	MinServiceBackoff = 250 * time.Millisecond
	MaxServiceBackoff = 30 * time.Second
	ServiceResetAfter = 10 * time.Second
	// ServiceStopGrace is how long DELETE /services waits after SIGTERM
	// before it sends SIGKILL to the service's process group.
	ServiceStopGrace = 10 * time.Second
)

// DefaultLogDir is the guest directory where the agent keeps services'
// logs unless PID 1 tells it another (ServiceStatus.Log names the file).
const DefaultLogDir = "/var/log/warren"

// ServiceStatus is a supervised service's state (GET /services).
type ServiceStatus struct {
	// Name and Argv are the service's, as given.
	Name string   `json:"name"`
	Argv []string `json:"argv"`
	// State is ServiceRunning, ServiceBackoff or ServiceStopped.
	State string `json:"state"`
	// Pid is the running process's pid (also its process group and
	// session id); 0 when none runs.
	Pid int `json:"pid,omitempty"`
	// Starts counts the processes started; Restarts those after the
	// first (Starts - 1 once it has started).
	Starts   int `json:"starts"`
	Restarts int `json:"restarts"`
	// RunningSince is when the running process started (guest clock);
	// zero when none runs.
	RunningSince time.Time `json:"running_since,omitzero"`
	// LastExit is how the previous process ended; nil before any ended.
	LastExit *ServiceExit `json:"last_exit,omitempty"`
	// LastError is the last failure to start the process (the program
	// was removed, the user no longer exists, ...); "" after a start
	// that worked.
	LastError string `json:"last_error,omitempty"`
	// Log is the guest path of the service's log.
	Log string `json:"log,omitempty"`
}

// ServiceExit is how a service's process ended.
type ServiceExit struct {
	// Code and Signal are as in ExitStatus.
	Code   int    `json:"code"`
	Signal string `json:"signal,omitempty"`
	// At is when the agent collected the exit (guest clock).
	At time.Time `json:"at"`
	// RanMS is how long the process ran, in milliseconds.
	RanMS int64 `json:"ran_ms"`
}

// FileInfo describes one file, as from lstat.
type FileInfo struct {
	// Name is the base name.
	Name string `json:"name"`
	// Size is the size in bytes.
	Size int64 `json:"size"`
	// Mode is the Go fs.FileMode (type and permission bits).
	Mode fs.FileMode `json:"mode"`
	// ModTime is the modification time.
	ModTime time.Time `json:"mod_time"`
	// IsDir says the file is a directory.
	IsDir bool `json:"is_dir"`
	// Link is a symbolic link's target.
	Link string `json:"link,omitempty"`
	// Path is the file's absolute path (in GET /list answers; the other
	// answers may leave it out).
	Path string `json:"path,omitempty"`
}

// Error codes of Error.Code.
const (
	CodeBadRequest       = "bad_request"
	CodeNotFound         = "not_found"
	CodePermission       = "permission_denied"
	CodeExists           = "exists"
	CodeIsDirectory      = "is_directory"
	CodeNotDirectory     = "not_directory"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeStartFailed      = "start_failed"
	CodeInternal         = "internal"
)

// Error is the agent's structured error: the JSON body of every failed
// request and the payload of FrameError. The client (agentclient)
// returns it as *Error.
type Error struct {
	// Message is a human-readable description.
	Message string `json:"error"`
	// Code is one of the Code* constants.
	Code string `json:"code"`
	// Status is the HTTP status it came with (0 inside an exec stream).
	Status int `json:"-"`
}

// Error implements error.
func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("agent: %s (%s, HTTP %d)", e.Message, e.Code, e.Status)
	}
	return fmt.Sprintf("agent: %s (%s)", e.Message, e.Code)
}

// Is lets errors.Is match fs.ErrNotExist, fs.ErrPermission and
// fs.ErrExist by code.
func (e *Error) Is(target error) bool {
	switch target {
	case fs.ErrNotExist:
		return e.Code == CodeNotFound
	case fs.ErrPermission:
		return e.Code == CodePermission
	case fs.ErrExist:
		return e.Code == CodeExists
	}
	return false
}

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// ReadFrame reads one frame, reusing buf when it is large enough. It
// returns io.EOF only at a clean frame boundary.
func ReadFrame(r io.Reader, buf []byte) (typ byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("agent: frame of %d bytes exceeds %d", n, MaxFrame)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[0], buf, nil
}
