"""The records the SDK returns: plain dataclasses built from the daemon's JSON.

Each keeps the JSON it came from in ``raw``, so fields this SDK does not
know yet are still reachable.
"""

from __future__ import annotations

import datetime as _dt
import re
import stat as _stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

__all__ = [
    "SandboxInfo",
    "SnapshotInfo",
    "RollbackInfo",
    "ProcessInfo",
    "ExitStatus",
    "PtySize",
    "CommandResult",
    "EntryInfo",
    "FileType",
    "FilesystemEvent",
    "parse_time",
    "go_mode_to_unix",
]

_TIME_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:?\d{2})?$"
)


def parse_time(s: Optional[str]) -> Optional[_dt.datetime]:
    """Parse a Go RFC 3339 time (nanoseconds, ``Z``) into an aware datetime; ``None`` if absent or unreadable.

    Go's zero time (year 1) is returned as ``None`` too.
    """
    if not s or not isinstance(s, str):
        return None
    m = _TIME_RE.match(s.strip())
    if not m:
        return None
    y, mo, d, h, mi, sec, frac, tz = m.groups()
    if int(y) <= 1:
        return None
    us = int((frac or "0")[:6].ljust(6, "0"))
    if tz is None or tz in ("Z", "z"):
        tzinfo = _dt.timezone.utc
    else:
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        tzinfo = _dt.timezone(sign * _dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    try:
        return _dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), us, tzinfo=tzinfo)
    except ValueError:
        return None


# Go's fs.FileMode bits (io/fs).
_GO_DIR = 1 << 31
_GO_SYMLINK = 1 << 27
_GO_DEVICE = 1 << 26
_GO_PIPE = 1 << 25
_GO_SOCKET = 1 << 24
_GO_SETUID = 1 << 23
_GO_SETGID = 1 << 22
_GO_CHARDEV = 1 << 21
_GO_STICKY = 1 << 20


def go_mode_to_unix(mode: int) -> int:
    """Turn a Go ``fs.FileMode`` number into a Unix ``st_mode`` (type and permission bits)."""
    m = mode & 0o777
    if mode & _GO_SETUID:
        m |= _stat.S_ISUID
    if mode & _GO_SETGID:
        m |= _stat.S_ISGID
    if mode & _GO_STICKY:
        m |= _stat.S_ISVTX
    if mode & _GO_DIR:
        m |= _stat.S_IFDIR
    elif mode & _GO_SYMLINK:
        m |= _stat.S_IFLNK
    elif mode & _GO_DEVICE:
        m |= _stat.S_IFCHR if mode & _GO_CHARDEV else _stat.S_IFBLK
    elif mode & _GO_PIPE:
        m |= _stat.S_IFIFO
    elif mode & _GO_SOCKET:
        m |= _stat.S_IFSOCK
    else:
        m |= _stat.S_IFREG
    return m


class FileType:
    """The ``type`` values of :class:`EntryInfo` (E2B's ``FileType``, as strings)."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    OTHER = "other"


@dataclass
class EntryInfo:
    """A guest file: an entry of ``files.list``, or what ``get_info``, ``write``, ``rename`` return.

    Attributes:
        name: the base name.
        path: the absolute guest path.
        type: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"`` (a device, FIFO, socket).
        size: the size in bytes.
        mode: the permission bits (``0o644``), setuid/setgid/sticky included.
        permissions: the permission bits as ``ls`` writes them (``"rw-r--r--"``).
        modified: the modification time.
        symlink_target: a symbolic link's target.
        raw: the daemon's JSON.
    """

    name: str
    path: str
    type: str
    size: int
    mode: int
    permissions: str
    modified: Optional[_dt.datetime]
    symlink_target: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], path: Optional[str] = None) -> "EntryInfo":
        """Build one from the daemon's FileInfo JSON; ``path`` is used when the JSON has none."""
        gm = int(d.get("mode") or 0)
        um = go_mode_to_unix(gm)
        link = d.get("link") or None
        if d.get("is_dir") or gm & _GO_DIR:
            t = FileType.DIR
        elif gm & _GO_SYMLINK or link:
            t = FileType.SYMLINK
        elif gm & (_GO_DEVICE | _GO_PIPE | _GO_SOCKET | _GO_CHARDEV):
            t = FileType.OTHER
        else:
            t = FileType.FILE
        p = d.get("path") or path or ""
        name = d.get("name") or (p.rstrip("/").rsplit("/", 1)[-1] if p else "")
        return cls(
            name=name,
            path=p,
            type=t,
            size=int(d.get("size") or 0),
            mode=_stat.S_IMODE(um),
            permissions=_stat.filemode(um)[1:],
            modified=parse_time(d.get("mod_time")),
            symlink_target=link,
            raw=dict(d),
        )


@dataclass
class FilesystemEvent:
    """A change under a watched directory (``files.watch_dir``).

    Attributes:
        name: the path relative to the watched directory (E2B's ``name``).
        path: the absolute guest path.
        type: ``"create"``, ``"write"``, ``"remove"``, ``"rename"`` (moved
            away; the new name comes as a ``"create"``), ``"chmod"``, or
            ``"overflow"`` (events were lost).
        is_dir: the path is a directory.
        time: when the guest saw it.
    """

    name: str
    path: str
    type: str
    is_dir: bool
    time: Optional[_dt.datetime]

    @classmethod
    def from_json(cls, d: Mapping[str, Any], root: str) -> "FilesystemEvent":
        """Build one from a watch stream line; ``root`` is the watched directory."""
        p = str(d.get("path") or "")
        r = root.rstrip("/") + "/"
        name = p[len(r):] if p.startswith(r) else p
        return cls(name=name, path=p, type=str(d.get("op") or ""), is_dir=bool(d.get("is_dir")), time=parse_time(d.get("time")))


@dataclass
class SnapshotInfo:
    """A sandbox's snapshot.

    Attributes:
        name: the snapshot's name (what ``rollback`` takes).
        kind: ``"full"`` or ``"incremental"``.
        time: when it was taken.
        layer_bytes: the size of its memory layer.
        pause_ms: how long the guest was paused for it.
        rolling: taken by the rolling snapshotter.
    """

    name: str
    kind: str
    time: Optional[_dt.datetime]
    layer_bytes: int = 0
    pause_ms: float = 0.0
    rolling: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SnapshotInfo":
        """Build one from the daemon's Snapshot JSON."""
        return cls(
            name=str(d.get("name") or ""),
            kind=str(d.get("kind") or ""),
            time=parse_time(d.get("time")),
            layer_bytes=int(d.get("layer_bytes") or 0),
            pause_ms=float(d.get("pause_ms") or 0.0),
            rolling=bool(d.get("rolling")),
            raw=dict(d),
        )


@dataclass
class RollbackInfo:
    """What a rollback did: the snapshot, how long the guest was paused, pages rewritten."""

    snapshot: str
    pause_ms: float
    total_ms: float
    pages_written: int
    pages_cleared: int
    line: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RollbackInfo":
        """Build one from the daemon's RollbackReply JSON."""
        return cls(
            snapshot=str(d.get("snapshot") or ""),
            pause_ms=float(d.get("pause_ms") or 0.0),
            total_ms=float(d.get("total_ms") or 0.0),
            pages_written=int(d.get("pages_written") or 0),
            pages_cleared=int(d.get("pages_cleared") or 0),
            line=str(d.get("line") or ""),
            raw=dict(d),
        )


@dataclass
class SandboxInfo:
    """A sandbox as the daemon describes it (``GET /v1/sandboxes/{id}``).

    Attributes:
        sandbox_id: its id.
        template_id: the template it was made from.
        status: ``"creating"``, ``"running"``, ``"paused"``, ``"suspended"``, ``"stopped"`` or ``"failed"``.
        reason: why it failed or stopped, if it did.
        labels: its labels (``"name"`` is how the CLI finds one by name).
        envs: the environment added to every process (``K=V`` parsed).
        mem_mib, cpus: its VMM's cgroup limits.
        network: it has a (filtered) network.
        parent: the sandbox it was forked from.
        snapshots: its snapshots, oldest first.
        started_at: when it was created; updated_at: when its record last changed.
        tenant: the tenant it belongs to.
        raw: the daemon's JSON (host paths included).
    """

    sandbox_id: str
    template_id: str
    status: str
    reason: Optional[str]
    labels: Dict[str, str]
    envs: Dict[str, str]
    mem_mib: int
    cpus: int
    network: bool
    parent: Optional[str]
    snapshots: List[SnapshotInfo]
    started_at: Optional[_dt.datetime]
    updated_at: Optional[_dt.datetime]
    tenant: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def metadata(self) -> Dict[str, str]:
        """E2B's name for :attr:`labels`."""
        return self.labels

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        """Build one from the daemon's Sandbox JSON."""
        envs: Dict[str, str] = {}
        for kv in d.get("env") or []:
            k, _, v = str(kv).partition("=")
            envs[k] = v
        return cls(
            sandbox_id=str(d.get("id") or ""),
            template_id=str(d.get("template") or ""),
            status=str(d.get("status") or ""),
            reason=d.get("reason") or None,
            labels=dict(d.get("labels") or {}),
            envs=envs,
            mem_mib=int(d.get("mem_mib") or 0),
            cpus=int(d.get("cpus") or 0),
            network=bool(d.get("network")),
            parent=d.get("parent") or None,
            snapshots=[SnapshotInfo.from_json(s) for s in d.get("snapshots") or []],
            started_at=parse_time(d.get("created")),
            updated_at=parse_time(d.get("updated")),
            tenant=str(d.get("tenant") or ""),
            raw=dict(d),
        )


@dataclass
class PtySize:
    """A terminal's size in characters."""

    rows: int
    cols: int


@dataclass
class ExitStatus:
    """How a process ended.

    Attributes:
        exit_code: the exit code, or 128+N when signal N killed it.
        signal: the signal that killed it (``"SIGKILL"``), if one did.
        timed_out: the sandbox killed it at its timeout.
    """

    exit_code: int
    signal: Optional[str] = None
    timed_out: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ExitStatus":
        """Build one from the JSON ``{"code", "signal", "timed_out"}`` (or an exit frame's ``exit``)."""
        code = d.get("code", d.get("exit"))
        return cls(exit_code=int(code or 0), signal=d.get("signal") or None, timed_out=bool(d.get("timed_out")))


@dataclass
class ProcessInfo:
    """A process of the sandbox (``commands.list()``, ``commands.get()``).

    Attributes:
        id: its id in the sandbox: what the process calls take.
        pid: its pid in the guest (also its process group).
        argv: its command line.
        cwd, user, tag: as started.
        pty: its terminal's size, if it has one.
        state: ``"running"`` or ``"exited"``.
        started_at: when it started (guest clock).
        exit: how it ended, once it has.
        output_bytes: how much output it wrote in all; output_from: the
            offset of the oldest byte still kept for replay.
        stdin_open: ``send_stdin`` still reaches it.
    """

    id: str
    pid: int
    argv: List[str]
    cwd: Optional[str]
    user: Optional[str]
    tag: Optional[str]
    pty: Optional[PtySize]
    state: str
    started_at: Optional[_dt.datetime]
    exit: Optional[ExitStatus]
    output_bytes: int
    output_from: int
    stdin_open: bool
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def running(self) -> bool:
        """The process has not exited."""
        return self.state == "running"

    @property
    def cmd(self) -> str:
        """E2B's ``cmd``: the program (``argv[0]``)."""
        return self.argv[0] if self.argv else ""

    @property
    def args(self) -> List[str]:
        """E2B's ``args``: the arguments after the program."""
        return self.argv[1:]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProcessInfo":
        """Build one from the daemon's ProcessInfo JSON."""
        pty = d.get("pty")
        ex = d.get("exit")
        return cls(
            id=str(d.get("id") or ""),
            pid=int(d.get("pid") or 0),
            argv=[str(a) for a in d.get("argv") or []],
            cwd=d.get("cwd") or None,
            user=d.get("user") or None,
            tag=d.get("tag") or None,
            pty=PtySize(int(pty.get("rows") or 0), int(pty.get("cols") or 0)) if isinstance(pty, dict) else None,
            state=str(d.get("state") or ""),
            started_at=parse_time(d.get("started_at")),
            exit=ExitStatus.from_json(ex) if isinstance(ex, dict) else None,
            output_bytes=int(d.get("output_bytes") or 0),
            output_from=int(d.get("output_from") or 0),
            stdin_open=bool(d.get("stdin_open")),
            raw=dict(d),
        )


@dataclass
class CommandResult:
    """A finished command (E2B's ``CommandResult``).

    Attributes:
        stdout, stderr: its output, decoded as UTF-8 (invalid bytes
            replaced); a PTY's output is all ``stdout``.
        exit_code: the exit code (128+N when signal N killed it).
        error: why it ended abnormally (``"killed by SIGKILL"``, ``"timed out"``), else ``None``.
        signal: the signal that killed it, if one did.
        timed_out: the sandbox killed it at its timeout.
        dropped: output bytes the sandbox no longer kept when they were
            read (a process that wrote more than its replay buffer before
            being read).
    """

    stdout: str
    stderr: str
    exit_code: int
    error: Optional[str] = None
    signal: Optional[str] = None
    timed_out: bool = False
    dropped: int = 0
