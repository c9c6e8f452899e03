"""Warren's Python SDK: sandboxes (microVMs) for AI agents, over warren-hostd's API.

Modelled on E2B's Python SDK::

    from warren import Sandbox

    with Sandbox.create(template="tpl-...") as sb:
        print(sb.commands.run("echo hello").stdout)
        sb.files.write("/tmp/x.txt", "hi")
        h = sb.commands.run("sleep 3; echo done", background=True)
        print(h.wait().stdout)

Standard library only. The daemon is found through ``WARREN_HOST``,
``WARREN_TENANT`` and ``WARREN_TOKEN`` (see :class:`ConnectionConfig`).
"""

from ._transport import DEFAULT_SOCKET, ConnectionConfig
from .aio import AsyncSandbox
from .commands import CommandHandle, Commands, Pty, PtyHandle
from .exceptions import (
    ApiError,
    AuthenticationError,
    CommandExitError,
    CommandTimeoutError,
    ConflictError,
    ConnectionError,
    ForkError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    StreamError,
    TimeoutError,
    WarrenError,
)
from .files import Files, ReadStream, WatchHandle
from .models import (
    CommandResult,
    EntryInfo,
    ExitStatus,
    FilesystemEvent,
    FileType,
    ProcessInfo,
    PtySize,
    RollbackInfo,
    SandboxInfo,
    SnapshotInfo,
)
from .sandbox import Sandbox

__version__ = "0.1.0"
"""The SDK's version."""

__all__ = [
    "Sandbox",
    "AsyncSandbox",
    "ConnectionConfig",
    "DEFAULT_SOCKET",
    "Commands",
    "CommandHandle",
    "Pty",
    "PtyHandle",
    "Files",
    "ReadStream",
    "WatchHandle",
    "CommandResult",
    "EntryInfo",
    "ExitStatus",
    "FilesystemEvent",
    "FileType",
    "ProcessInfo",
    "PtySize",
    "RollbackInfo",
    "SandboxInfo",
    "SnapshotInfo",
    "WarrenError",
    "ApiError",
    "AuthenticationError",
    "CommandExitError",
    "CommandTimeoutError",
    "ConflictError",
    "ConnectionError",
    "ForkError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "ServerError",
    "StreamError",
    "TimeoutError",
]
