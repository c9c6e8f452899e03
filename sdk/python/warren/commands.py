"""Processes in a sandbox: ``sandbox.commands`` and ``sandbox.pty``.

Every command is a process of the daemon's process API: started with
``POST /v1/sandboxes/{id}/processes``, its output read from
``GET .../processes/{pid}/output`` at an offset. A process outlives the
connection that started it, so a foreground ``run`` whose connection
breaks (the daemon restarted, the sandbox was paused or restored under
it) reconnects from the offset it had reached, and any client may come
back to a process later with ``commands.connect``.
"""

from __future__ import annotations

import base64
import codecs
import shlex
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

from . import exceptions as exc
from ._transport import Stream, Transport, seg
from .models import CommandResult, ExitStatus, ProcessInfo, PtySize

__all__ = ["Commands", "CommandHandle", "Pty", "PtyHandle", "OutputCallback", "DataCallback"]

OutputCallback = Callable[[str], Any]
"""Receives a command's output as it comes, decoded as UTF-8."""

DataCallback = Callable[[bytes], Any]
"""Receives a terminal's output bytes as they come."""

ProcessRef = Union[str, int]
"""A process: its id in the sandbox (``str``: ``handle.id``, ``ProcessInfo.id``) or its guest pid (``int``)."""

DEFAULT_RECONNECT_TIMEOUT = 60.0
"""Seconds a handle keeps trying to get back to a process's output stream before :class:`StreamError`."""


def _argv(cmd: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    argv = [str(a) for a in cmd]
    if not argv:
        raise exc.InvalidArgumentError("an empty command")
    return argv


def _env_list(envs: Optional[Mapping[str, str]]) -> Optional[List[str]]:
    if not envs:
        return None
    return [f"{k}={v}" for k, v in envs.items()]


def _to_bytes(data: Union[str, bytes, bytearray, memoryview]) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _error_text(st: ExitStatus) -> Optional[str]:
    if st.timed_out:
        return "timed out" + (f" (killed by {st.signal})" if st.signal else "")
    if st.signal:
        return f"killed by {st.signal}"
    return None


class _Procs:
    """The process calls of one sandbox, shared by commands, pty and the handles."""

    def __init__(self, transport: Transport, sandbox_id: str) -> None:
        self.t = transport
        self.sandbox_id = sandbox_id

    def path(self, pid: Optional[str] = None, rest: str = "") -> str:
        p = f"/v1/sandboxes/{seg(self.sandbox_id)}/processes"
        if pid is not None:
            p += "/" + seg(pid) + rest
        return p

    def start(self, body: Dict[str, Any], request_timeout: Optional[float]) -> ProcessInfo:
        timeout: Any = request_timeout if request_timeout is not None else "default"
        return ProcessInfo.from_json(self.t.call("POST", self.path(), json_body=body, timeout=timeout))

    def list(self) -> List[ProcessInfo]:
        return [ProcessInfo.from_json(d) for d in self.t.call("GET", self.path()) or []]

    def resolve(self, pid: ProcessRef) -> str:
        """The process id of ``pid``: a ``str`` is one; an ``int`` is a guest pid, looked up."""
        if isinstance(pid, str):
            return pid
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise exc.InvalidArgumentError(f"a process is its id (str) or guest pid (int), not {pid!r}")
        for p in self.list():
            if p.pid == pid:
                return p.id
        raise exc.NotFoundError(f"no process with guest pid {pid} in sandbox {self.sandbox_id}", 404)

    def get(self, pid: ProcessRef) -> ProcessInfo:
        return ProcessInfo.from_json(self.t.call("GET", self.path(self.resolve(pid))))

    def signal(self, pid: ProcessRef, signal: str) -> ProcessInfo:
        d = self.t.call("POST", self.path(self.resolve(pid), "/signal"), json_body={"signal": signal})
        return ProcessInfo.from_json(d)

    def kill(self, pid: ProcessRef) -> bool:
        try:
            info = self.get(pid)
            if not info.running:
                return False  # the sandbox would signal nothing: E2B's kill says False
            self.signal(info.id, "SIGKILL")
        except exc.NotFoundError:
            return False
        return True

    def remove(self, pid: ProcessRef) -> bool:
        try:
            self.t.call("DELETE", self.path(self.resolve(pid)))
        except exc.NotFoundError:
            return False
        return True

    def send_stdin(self, pid: ProcessRef, data: Union[str, bytes], eof: bool = False) -> None:
        pid = self.resolve(pid)
        b = _to_bytes(data)
        step = 256 << 10
        chunks = [b[i : i + step] for i in range(0, len(b), step)] or [b""]
        for i, c in enumerate(chunks):
            last = i == len(chunks) - 1
            if not c and not (last and eof):
                continue
            self.t.call("POST", self.path(pid, "/stdin"), {"eof": 1} if last and eof else None, body=c)

    def resize(self, pid: ProcessRef, rows: int, cols: int) -> ProcessInfo:
        d = self.t.call("POST", self.path(self.resolve(pid), "/resize"), json_body={"rows": int(rows), "cols": int(cols)})
        return ProcessInfo.from_json(d)

    def wait_info(self, pid: ProcessRef) -> ProcessInfo:
        return ProcessInfo.from_json(self.t.call("GET", self.path(self.resolve(pid), "/wait"), timeout=None))


class CommandHandle:
    """A running process of the sandbox (E2B's ``CommandHandle``).

    ``run(..., background=True)`` and ``commands.connect`` return one. Its
    output is read from the sandbox at an offset that the handle keeps, so
    :meth:`wait` or iteration picks up where they stopped, across broken
    connections. Output callbacks given when the handle was made run on a
    thread of the handle's own from then on; otherwise :meth:`wait`
    delivers output to its callbacks, or iterating the handle yields
    ``(stdout, stderr, pty)`` tuples (one of them set) as E2B's does.

    Attributes:
        id: the process's id in the sandbox (what the process calls take).
        pid: its pid in the guest.
        info: its state when the handle was made.
    """

    _pty = False

    def __init__(
        self,
        procs: _Procs,
        info: ProcessInfo,
        offset: Optional[int] = 0,
        reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT,
    ) -> None:
        self._procs = procs
        self.info = info
        self.id = info.id
        self.pid = info.pid
        self.reconnect_timeout = reconnect_timeout
        self._offset: Optional[int] = offset
        self._out: List[bytes] = []
        self._err: List[bytes] = []
        self._dropped = 0
        self._exit: Optional[ExitStatus] = None
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._stream: Optional[Stream] = None
        self._disconnected = False
        self._thread: Optional[threading.Thread] = None
        self._thread_error: Optional[BaseException] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, pid={self.pid}, exit_code={self.exit_code})"

    # -- state -------------------------------------------------------------

    @property
    def sandbox_id(self) -> str:
        """The id of the sandbox the process runs in."""
        return self._procs.sandbox_id

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once the handle has read the exit, else ``None``."""
        return self._exit.exit_code if self._exit else None

    @property
    def stdout(self) -> str:
        """The standard output read so far, decoded."""
        with self._lock:
            return b"".join(self._out).decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """The standard error read so far, decoded."""
        with self._lock:
            return b"".join(self._err).decode("utf-8", "replace")

    @property
    def offset(self) -> Optional[int]:
        """The offset in the process's output the handle has read up to (``None`` before the first read of a replay)."""
        return self._offset

    # -- reading -----------------------------------------------------------

    def _events(self) -> Iterator[Tuple[str, bytes]]:
        """The process's output from the handle's offset on, as ``("stdout"|"stderr", bytes)``, until its exit.

        Reconnects when the stream breaks, for up to ``reconnect_timeout``
        seconds without progress.
        """
        failing_since: Optional[float] = None
        delay = 0.1
        last_err: Optional[BaseException] = None
        while self._exit is None:
            if self._disconnected:
                raise exc.StreamError("the handle was disconnected (the process still runs: commands.connect gets it back)")
            if failing_since is not None and time.monotonic() - failing_since > self.reconnect_timeout:
                raise exc.StreamError(
                    f"lost the output of process {self.id} in {self.sandbox_id} for {self.reconnect_timeout:.0f} s: {last_err}"
                ) from last_err
            q: Dict[str, Any] = {"follow": 1}
            if self._offset is not None:
                q["offset"] = self._offset
            try:
                stream = self._procs.t.open("GET", self._procs.path(self.id, "/output"), q, timeout=None)
            except (exc.ConnectionError, exc.ServerError, exc.ConflictError, exc.TimeoutError, exc.RateLimitError) as e:
                last_err = e
                failing_since = failing_since or time.monotonic()
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            with self._lock:
                self._stream = stream
            if self._disconnected:
                stream.close()
                continue
            try:
                for doc in stream.lines():
                    if doc.get("start") is not None:
                        st = doc["start"] or {}
                        self._offset = int(st.get("offset") or 0)
                        self._dropped += int(st.get("dropped") or 0)
                        failing_since, delay = None, 0.1
                        continue
                    if doc.get("error"):
                        raise exc.StreamError(str(doc["error"]))
                    for key in ("stdout", "stderr"):
                        v = doc.get(key)
                        if v:
                            b = base64.b64decode(v)
                            with self._lock:
                                self._offset = (self._offset or 0) + len(b)
                                (self._out if key == "stdout" else self._err).append(b)
                            failing_since, delay = None, 0.1
                            yield key, b
                    if "exit" in doc and doc["exit"] is not None:
                        self._exit = ExitStatus(
                            exit_code=int(doc["exit"]), signal=doc.get("signal") or None, timed_out=bool(doc.get("timed_out"))
                        )
                        return
                last_err = exc.StreamError("the output stream ended before the process's exit")
            except exc.StreamError as e:
                last_err = e
            finally:
                with self._lock:
                    self._stream = None
                stream.close()
            failing_since = failing_since or time.monotonic()
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _consume(
        self,
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        on_pty: Optional[DataCallback],
    ) -> None:
        dec_out = codecs.getincrementaldecoder("utf-8")("replace")
        dec_err = codecs.getincrementaldecoder("utf-8")("replace")
        with self._reading:
            for key, b in self._events():
                if self._pty:
                    if on_pty:
                        on_pty(b)
                    elif on_stdout:
                        s = dec_out.decode(b)
                        if s:
                            on_stdout(s)
                elif key == "stdout" and on_stdout:
                    s = dec_out.decode(b)
                    if s:
                        on_stdout(s)
                elif key == "stderr" and on_stderr:
                    s = dec_err.decode(b)
                    if s:
                        on_stderr(s)
            for dec, cb in ((dec_out, on_stdout), (dec_err, on_stderr)):
                tail = dec.decode(b"", final=True)
                if tail and cb:
                    cb(tail)

    def _start_reader(
        self,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_pty: Optional[DataCallback] = None,
    ) -> None:
        def run() -> None:
            try:
                self._consume(on_stdout, on_stderr, on_pty)
            except BaseException as e:  # handed to wait()
                self._thread_error = e

        self._thread = threading.Thread(target=run, name=f"warren-output-{self.id}", daemon=True)
        self._thread.start()

    def _result(self) -> CommandResult:
        assert self._exit is not None
        with self._lock:
            out = b"".join(self._out).decode("utf-8", "replace")
            err = b"".join(self._err).decode("utf-8", "replace")
        st = self._exit
        return CommandResult(
            stdout=out,
            stderr=err,
            exit_code=st.exit_code,
            error=_error_text(st),
            signal=st.signal,
            timed_out=st.timed_out,
            dropped=self._dropped,
        )

    def wait(
        self,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_pty: Optional[DataCallback] = None,
    ) -> CommandResult:
        """Wait until the process exits and return its result.

        Output not yet read goes to the callbacks (unless the handle was
        made with callbacks: their thread delivers it, and these are
        ignored). A non-zero exit raises :class:`CommandExitError` (the
        result in it; :class:`CommandTimeoutError` when the command's
        timeout killed it), as in E2B. A stream that cannot be resumed
        raises :class:`StreamError`; ``wait`` may be called again.
        """
        if self._thread is not None:
            self._thread.join()
            if self._thread_error is not None:
                e, self._thread_error, self._thread = self._thread_error, None, None
                raise e
        elif self._exit is None:
            self._consume(on_stdout, on_stderr, on_pty)
        res = self._result()
        if res.exit_code != 0 or res.signal:
            if res.timed_out:
                raise exc.CommandTimeoutError(res)
            raise exc.CommandExitError(res)
        return res

    def __iter__(self) -> Iterator[Tuple[Optional[str], Optional[str], Optional[bytes]]]:
        """Yield the output as it comes: ``(stdout, None, None)``, ``(None, stderr, None)``, or for a terminal ``(None, None, data)``.

        Iteration ends at the process's exit; then :meth:`wait` returns the
        result. Not for a handle made with callbacks (their thread reads).
        """
        if self._thread is not None:
            raise exc.WarrenError("this handle's output goes to the callbacks it was made with")
        dec_out = codecs.getincrementaldecoder("utf-8")("replace")
        dec_err = codecs.getincrementaldecoder("utf-8")("replace")
        with self._reading:
            for key, b in self._events():
                if self._pty:
                    yield None, None, b
                elif key == "stdout":
                    s = dec_out.decode(b)
                    if s:
                        yield s, None, None
                else:
                    s = dec_err.decode(b)
                    if s:
                        yield None, s, None
            tail = dec_out.decode(b"", final=True)
            if tail:
                yield tail, None, None
            tail = dec_err.decode(b"", final=True)
            if tail:
                yield None, tail, None

    # -- control -----------------------------------------------------------

    def kill(self) -> bool:
        """Kill the process (SIGKILL to its process group). ``False`` if it had already exited or is unknown."""
        return self._procs.kill(self.id)

    def signal(self, signal: str) -> ProcessInfo:
        """Send ``signal`` (``"SIGTERM"``, ``"TERM"``, ``"15"``) to the process's group; return its state."""
        return self._procs.signal(self.id, signal)

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Write ``data`` to the process's standard input (started with ``stdin=True``, or a terminal)."""
        self._procs.send_stdin(self.id, data)

    def close_stdin(self) -> None:
        """Close the process's standard input (it reads end-of-file)."""
        self._procs.send_stdin(self.id, b"", eof=True)

    def info_now(self) -> ProcessInfo:
        """The process's state now, from the sandbox."""
        return self._procs.get(self.id)

    def disconnect(self) -> None:
        """Stop reading the output; the process keeps running.

        A :meth:`wait` in progress raises :class:`StreamError`.
        ``sandbox.commands.connect(handle.id)`` gets the process back.
        """
        self._disconnected = True
        with self._lock:
            s = self._stream
        if s is not None:
            s.abort()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)


class Commands:
    """``sandbox.commands``: run commands and manage the sandbox's processes (E2B's ``Commands``)."""

    def __init__(self, procs: _Procs) -> None:
        self._procs = procs

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        background: Literal[False] = False,
        envs: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        cwd: Optional[str] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        stdin: bool = False,
        timeout: Optional[float] = None,
        tag: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        background: Literal[True],
        envs: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        cwd: Optional[str] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        stdin: bool = False,
        timeout: Optional[float] = None,
        tag: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> CommandHandle: ...

    @overload
    def run(
        self,
        cmd: Union[str, Sequence[str]],
        background: bool = False,
        envs: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        cwd: Optional[str] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        stdin: bool = False,
        timeout: Optional[float] = None,
        tag: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> Union[CommandResult, CommandHandle]: ...

    def run(
        self,
        cmd: Union[str, Sequence[str]],
        background: bool = False,
        envs: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        cwd: Optional[str] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        stdin: bool = False,
        timeout: Optional[float] = None,
        tag: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> Union[CommandResult, CommandHandle]:
        """Run a command in the sandbox.

        Args:
            cmd: a string, run with ``/bin/sh -c`` (as E2B does), or a list:
                the argv, run as it is.
            background: return a :class:`CommandHandle` at once instead of
                waiting for the exit.
            envs: environment variables, added after the sandbox's own.
            user: the guest user to run as (default the agent's, root).
            cwd: the working directory.
            on_stdout, on_stderr: receive output as it comes (decoded
                UTF-8 text). With ``background=True`` they are called from
                a thread of the handle's.
            stdin: keep standard input open for ``send_stdin`` (otherwise
                it is ``/dev/null``).
            timeout: seconds after which the sandbox kills the command
                (``None``: never). Unlike E2B's there is no default limit.
            tag: a free-form label reported in ``commands.list()``.
            request_timeout: seconds the start request may take.

        Returns:
            :class:`CommandResult` for a foreground command (a non-zero
            exit raises :class:`CommandExitError` carrying it), or a
            :class:`CommandHandle` with ``background=True``.
        """
        body: Dict[str, Any] = {"argv": _argv(cmd)}
        env = _env_list(envs)
        if env:
            body["env"] = env
        if cwd:
            body["cwd"] = cwd
        if user:
            body["user"] = user
        if timeout:
            body["timeout_ms"] = max(1, int(timeout * 1000))
        if stdin:
            body["stdin"] = True
        if tag:
            body["tag"] = tag
        info = self._procs.start(body, request_timeout)
        h = CommandHandle(self._procs, info, offset=0)
        if not background:
            return h.wait(on_stdout=on_stdout, on_stderr=on_stderr)
        if on_stdout or on_stderr:
            h._start_reader(on_stdout, on_stderr)
        return h

    def list(self) -> List[ProcessInfo]:
        """The sandbox's processes (running and recently exited), oldest first."""
        return self._procs.list()

    def get(self, pid: ProcessRef) -> ProcessInfo:
        """One process's state (``pid``: its id, or its guest pid as an ``int``)."""
        return self._procs.get(pid)

    def connect(
        self,
        pid: ProcessRef,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        replay: bool = True,
    ) -> CommandHandle:
        """A new handle to a process of the sandbox, from this or any earlier client.

        Args:
            pid: the process's id (``handle.id``, ``ProcessInfo.id``) or its guest pid (``int``).
            on_stdout, on_stderr: receive its output from a thread of the
                handle's (else use ``wait``'s callbacks or iterate).
            replay: start from the oldest output the sandbox keeps (the
                default: up to 1 MiB); ``False`` starts from now.
        """
        info = self._procs.get(pid)
        h = CommandHandle(self._procs, info, offset=None if replay else info.output_bytes)
        if on_stdout or on_stderr:
            h._start_reader(on_stdout, on_stderr)
        return h

    def kill(self, pid: ProcessRef) -> bool:
        """Kill a process (SIGKILL to its group). ``False`` if it was not found or had exited."""
        return self._procs.kill(pid)

    def signal(self, pid: ProcessRef, signal: str) -> ProcessInfo:
        """Send a signal (``"SIGTERM"``, ``"TERM"`` or ``"15"``) to a process's group."""
        return self._procs.signal(pid, signal)

    def remove(self, pid: ProcessRef) -> bool:
        """Kill a process if it still runs and make the sandbox forget it. ``False`` if unknown."""
        return self._procs.remove(pid)

    def send_stdin(self, pid: ProcessRef, data: Union[str, bytes]) -> None:
        """Write to a process's standard input (one started with ``stdin=True``, or a terminal)."""
        self._procs.send_stdin(pid, data)

    def close_stdin(self, pid: ProcessRef) -> None:
        """Close a process's standard input."""
        self._procs.send_stdin(pid, b"", eof=True)


class PtyHandle(CommandHandle):
    """A process on a pseudo-terminal (``sandbox.pty.create``): its output is bytes, all on one stream."""

    _pty = True

    def send_input(self, data: Union[str, bytes]) -> None:
        """Type ``data`` into the terminal."""
        self._procs.send_stdin(self.id, data)

    def resize(self, rows: int, cols: int) -> ProcessInfo:
        """Set the terminal's size (the process gets SIGWINCH)."""
        return self._procs.resize(self.id, rows, cols)


class Pty:
    """``sandbox.pty``: processes on pseudo-terminals (E2B's ``Pty``)."""

    def __init__(self, procs: _Procs) -> None:
        self._procs = procs

    def create(
        self,
        size: Union[PtySize, Tuple[int, int]] = PtySize(24, 80),
        on_data: Optional[DataCallback] = None,
        cwd: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        cmd: Union[str, Sequence[str]] = "/bin/bash -i",
        timeout: Optional[float] = None,
        tag: Optional[str] = None,
    ) -> PtyHandle:
        """Start ``cmd`` on a new terminal of ``size`` and return its handle.

        Args:
            size: ``PtySize(rows, cols)`` or ``(rows, cols)``.
            on_data: receives the terminal's output bytes, from a thread of
                the handle's (else read with ``wait(on_pty=...)`` or iterate).
            cwd, envs, user: as for ``commands.run`` (``TERM`` defaults to
                ``xterm-256color``).
            cmd: the program: a string is split like a shell would
                (``shlex``), not run through one; a list is the argv.
            timeout: seconds after which the sandbox kills it (``None``: never).
            tag: a free-form label.
        """
        rows, cols = (size.rows, size.cols) if isinstance(size, PtySize) else (int(size[0]), int(size[1]))
        argv = shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]
        body: Dict[str, Any] = {"argv": argv, "pty": {"rows": rows, "cols": cols}}
        env = _env_list(envs)
        if env:
            body["env"] = env
        if cwd:
            body["cwd"] = cwd
        if user:
            body["user"] = user
        if timeout:
            body["timeout_ms"] = max(1, int(timeout * 1000))
        if tag:
            body["tag"] = tag
        info = self._procs.start(body, None)
        h = PtyHandle(self._procs, info, offset=0)
        if on_data:
            h._start_reader(on_pty=on_data)
        return h

    def connect(self, pid: ProcessRef, on_data: Optional[DataCallback] = None, replay: bool = True) -> PtyHandle:
        """A new handle to a terminal process (see ``commands.connect``)."""
        info = self._procs.get(pid)
        h = PtyHandle(self._procs, info, offset=None if replay else info.output_bytes)
        if on_data:
            h._start_reader(on_pty=on_data)
        return h

    def send_stdin(self, pid: ProcessRef, data: Union[str, bytes]) -> None:
        """Type ``data`` into a terminal process."""
        self._procs.send_stdin(pid, data)

    def resize(self, pid: ProcessRef, size: Union[PtySize, Tuple[int, int]]) -> ProcessInfo:
        """Set a terminal process's size."""
        rows, cols = (size.rows, size.cols) if isinstance(size, PtySize) else (int(size[0]), int(size[1]))
        return self._procs.resize(pid, rows, cols)

    def kill(self, pid: ProcessRef) -> bool:
        """Kill a terminal process. ``False`` if it was not found or had exited."""
        return self._procs.kill(pid)
