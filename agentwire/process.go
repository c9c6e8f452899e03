package agentwire

import "time"

// The process API: processes that outlive the request that started them.
//
// A process started by POST /processes gets an id and runs until it exits
// or is killed, whatever happens to the connections of its clients: its
// standard output and error (or its terminal's output) are read by the
// agent all along and kept, in arrival order, in a bounded per-process
// buffer (MaxProcessOutput bytes; older bytes are dropped). A client reads
// them with GET /processes/{id}/output, from any offset still kept, and
// follows them until the process exits, as often as it likes: this is how
// a client that lost its connection (its own restart, a pause, a snapshot
// restore, a fork) comes back to a running command.
//
// Endpoints (the agent's; the daemon serves the same under
// /v1/sandboxes/{id}/processes):
//
//	POST   /processes                 ProcessRequest -> ProcessInfo
//	GET    /processes                 -> []ProcessInfo, oldest first
//	GET    /processes/{id}            -> ProcessInfo
//	GET    /processes/{id}/output     ?offset=N&follow=0|1 -> frames (below)
//	POST   /processes/{id}/stdin      raw body, ?eof=1 closes stdin after it
//	POST   /processes/{id}/signal     SignalRequest -> ProcessInfo
//	POST   /processes/{id}/resize     TerminalSize -> ProcessInfo
//	GET    /processes/{id}/wait       -> ProcessInfo once it has exited
//	DELETE /processes/{id}            SIGKILLs a running one, forgets it
//
// The output stream is framed like /exec's (WriteFrame): first one
// FrameOutputStart (JSON OutputStart: where the stream starts), then
// FrameStdout and FrameStderr chunks in the order the agent read them (a
// terminal's output is all FrameStdout), and, when the process has exited
// and everything kept was sent, FrameExit (JSON ExitStatus). With follow=0
// the stream ends after what is kept now (with FrameExit if the process
// has exited); with follow=1 (the default) it waits for more output until
// the exit. offset is a position in the process's output counted from its
// start (stdout and stderr together); absent or negative means from the
// oldest byte kept; an offset past the end waits for output from there.
// A reader that falls so far behind that the bytes it would read next are
// no longer kept goes on at the oldest byte kept, after another
// FrameOutputStart saying where (Offset) and how many bytes it missed
// (Dropped); a reader that counts the bytes it got from the first
// FrameOutputStart's Offset on always knows the offset it is at.
//
// Answers: POST /processes is 201 with the ProcessInfo; a start refused
// because MaxProcesses processes all run is CodeBadRequest with HTTP
// 429. POST /processes/{id}/stdin is 204; a process started without
// Stdin, or whose stdin was closed, or that has exited, is
// CodeBadRequest; a body over MaxStdinChunk is CodeBadRequest with HTTP
// 413; a process that does not read its input within the request (at
// most a minute) is HTTP 504 (the part written stays written). For a
// terminal process, eof=1 writes the terminal's EOF character (^D,
// which ends the input of a program reading a line at its start) and
// the terminal stays open. Signalling or resizing a process that has
// exited is no error (nothing is done); resizing one without a terminal
// is CodeBadRequest. DELETE is 204. An unknown id is CodeNotFound.
//
// Processes live in the guest's memory, so they are paused with it, saved
// in its snapshots and copied into forked children: a restored sandbox or a
// child lists them as they were. Ids are unique within a sandbox; after
// every restore (a sandbox created from a template, a fork child, a
// rollback, a resume from disk) the agent names the processes it starts
// from a new id namespace (a new prefix, drawn with the host's entropy of
// that restore's re-sync), so the new processes of a parent and its
// children, or of two sandboxes from one template, never share ids. Ids are "<prefix>-<n>": 8 hex digits, a dash, a decimal
// number.
//
// The file API's additions (answers as the other file calls': FileInfo
// JSON, errors with a Code):
//
//	GET    /list?path=&depth=N          -> []FileInfo, each with Path
//	POST   /mkdir?path=&mode=&parents=1 -> FileInfo
//	DELETE /files?path=&recursive=1     -> 204
//	POST   /rename?from=&to=            -> FileInfo of to
//	GET    /watch?path=&recursive=1     -> NDJSON WatchEvent lines
//
// /list walks depth levels (1 to MaxListDepth, default 1; another depth
// is CodeBadRequest), parents before their children, siblings by name,
// not into symbolic links to directories; a subdirectory it cannot read
// is listed without its entries. /mkdir's mode (octal, default 755) is
// the new directory's exactly (no umask); with parents=1 missing
// parents are made (755 less the umask) and an existing directory is no
// error, an existing file is CodeExists. DELETE /files of a missing path
// is CodeNotFound, of a non-empty directory without recursive
// CodeExists, of "/" CodeBadRequest; recursive removes symbolic links,
// not what they point to. /watch's path must be a directory
// (CodeNotDirectory); a recursive watch of a tree of more than
// MaxWatches directories is CodeBadRequest, and a directory created
// under it past that bound is reported as an "overflow" event with its
// path; the stream ends when the client goes away, or after the
// watched directory's "remove" or "rename" event.

// FrameOutputStart opens a GET /processes/{id}/output stream; its payload
// is a JSON OutputStart.
const FrameOutputStart byte = 5

// Limits of the process API.
const (
	// MaxProcessOutput is how many bytes of a process's output (stdout
	// and stderr together) the agent keeps for replay.
	MaxProcessOutput = 1 << 20
	// MaxProcesses bounds the processes the agent keeps: running ones
	// count, and when a start would pass the bound, the exited process
	// that exited longest ago is forgotten; when all are running the start
	// is refused.
	MaxProcesses = 256
	// MaxStdinChunk bounds one POST /processes/{id}/stdin body.
	MaxStdinChunk = 1 << 20
	// MaxInfoArgv bounds the bytes of ProcessInfo.Argv, so that a
	// process's state stays a small reply (a list of MaxProcesses of them
	// too) whatever its command line.
	MaxInfoArgv = 4096
)

// Process states (ProcessInfo.State).
const (
	// ProcessRunning: the process has not exited.
	ProcessRunning = "running"
	// ProcessExited: it exited (or was killed); Exit says how.
	ProcessExited = "exited"
)

// TerminalSize is a terminal's size in characters (and the body of POST
// /processes/{id}/resize).
type TerminalSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ProcessRequest asks the agent to start a process (POST /processes).
type ProcessRequest struct {
	// Argv, Env, Cwd and User are as in ExecRequest (Argv and Env at
	// most 4096 entries each, Cwd at most 4096 bytes, User 256).
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	User string   `json:"user,omitempty"`
	// TimeoutMS, when positive, kills the process group after that many
	// milliseconds; 0 means never.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// PTY, when set, runs the process on a new pseudo-terminal of that
	// size as its controlling terminal (stdin, stdout and stderr; TERM
	// defaults to xterm-256color); its output is all FrameStdout.
	PTY *TerminalSize `json:"pty,omitempty"`
	// Stdin keeps the process's standard input open for POST
	// /processes/{id}/stdin; otherwise it is /dev/null (a PTY process's
	// input is always its terminal).
	Stdin bool `json:"stdin,omitempty"`
	// Tag is a free-form label (at most 256 bytes) reported back.
	Tag string `json:"tag,omitempty"`
}

// ProcessInfo is a process's state.
type ProcessInfo struct {
	// ID names the process in this sandbox.
	ID string `json:"id"`
	// Pid is its pid in the guest (also its process group id).
	Pid int `json:"pid"`
	// Argv is the request's, abbreviated to MaxInfoArgv bytes in all
	// (the arguments past the bound dropped, the one across it cut),
	// which ArgvTruncated then says; the process runs with all of it.
	Argv          []string `json:"argv"`
	ArgvTruncated bool     `json:"argv_truncated,omitempty"`

	Cwd  string `json:"cwd,omitempty"`
	User string `json:"user,omitempty"`
	Tag  string `json:"tag,omitempty"`
	// PTY is its terminal's size, if it has one.
	PTY *TerminalSize `json:"pty,omitempty"`
	// State is ProcessRunning or ProcessExited.
	State string `json:"state"`
	// StartedAt is when it started (guest clock).
	StartedAt time.Time `json:"started_at"`
	// Exit is how it ended, once it has.
	Exit *ExitStatus `json:"exit,omitempty"`
	// OutputBytes is how much output it has written in all; OutputFrom
	// the offset of the oldest byte still kept.
	OutputBytes int64 `json:"output_bytes"`
	OutputFrom  int64 `json:"output_from"`
	// StdinOpen says POST /processes/{id}/stdin still reaches it.
	StdinOpen bool `json:"stdin_open,omitempty"`
}

// OutputStart is the payload of FrameOutputStart.
type OutputStart struct {
	// Offset is the position of the stream's first byte.
	Offset int64 `json:"offset"`
	// Dropped is how many bytes between the requested offset and Offset
	// were no longer kept.
	Dropped int64 `json:"dropped,omitempty"`
}

// SignalRequest is the body of POST /processes/{id}/signal.
type SignalRequest struct {
	// Signal is a name ("SIGTERM", "TERM") or a number ("15"); it goes to
	// the process's group.
	Signal string `json:"signal"`
}

// WatchEvent is one line of GET /watch (NDJSON): a change under the
// watched directory.
type WatchEvent struct {
	// Op is "ready" first (the watches are in place; Path is the watched
	// directory), then one of "create", "write", "remove", "rename"
	// (moved away; its new name, if under a watched directory, comes as a
	// "create"), "chmod", or "overflow" (events were lost: the kernel's
	// queue was full, Path the watched directory; or a new directory was
	// not watched for MaxWatches, Path that directory).
	Op string `json:"op"`
	// Path is the absolute guest path changed.
	Path string `json:"path"`
	// IsDir says the path is a directory.
	IsDir bool `json:"is_dir,omitempty"`
	// Time is when the agent saw it (guest clock).
	Time time.Time `json:"time"`
}

// Limits of the file API.
const (
	// MaxListDepth is the deepest GET /list?depth= goes.
	MaxListDepth = 32
	// MaxListEntries bounds one GET /list answer; a deeper walk stops
	// there and says so (the answer is an error, CodeBadRequest, "too
	// many entries").
	MaxListEntries = 100000
	// MaxWatches bounds the directories one GET /watch?recursive=1 adds.
	MaxWatches = 8192
)
