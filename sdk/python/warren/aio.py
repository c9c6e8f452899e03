"""An asyncio face of the SDK: :class:`AsyncSandbox` runs the synchronous
calls in a worker thread (``asyncio.to_thread``), so they do not block the
event loop. Output callbacks are called from worker threads, not the loop:
use ``loop.call_soon_threadsafe`` in them to touch loop state.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, List, Optional, TypeVar

from .models import SandboxInfo
from .sandbox import Sandbox

__all__ = ["AsyncSandbox"]

R = TypeVar("R")


async def _run(fn: Callable[..., R], *a: Any, **kw: Any) -> R:
    return await asyncio.to_thread(functools.partial(fn, *a, **kw))


class _AsyncProxy:
    """Wraps an object so that its methods are awaited in a worker thread."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        async def call(*a: Any, **kw: Any) -> Any:
            return await _run(attr, *a, **kw)

        call.__doc__ = attr.__doc__
        call.__name__ = name
        return call


class AsyncSandbox:
    """An async :class:`Sandbox`: every method is a coroutine run in a worker thread.

    ``sandbox.commands``, ``sandbox.files`` and ``sandbox.pty`` are
    wrapped the same way (``await sb.commands.run("ls")``); the handles
    they return are the synchronous ones (call their blocking methods with
    ``asyncio.to_thread``). ``async with await AsyncSandbox.create(...)``
    kills the sandbox on exit.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        self.sandbox_id = sandbox.sandbox_id
        self.commands = _AsyncProxy(sandbox.commands)
        self.files = _AsyncProxy(sandbox.files)
        self.pty = _AsyncProxy(sandbox.pty)

    def __repr__(self) -> str:
        return f"AsyncSandbox(sandbox_id={self.sandbox_id!r})"

    @classmethod
    async def create(cls, *a: Any, **kw: Any) -> "AsyncSandbox":
        """:meth:`Sandbox.create`, awaited."""
        return cls(await _run(Sandbox.create, *a, **kw))

    @classmethod
    async def connect(cls, *a: Any, **kw: Any) -> "AsyncSandbox":
        """:meth:`Sandbox.connect`, awaited."""
        return cls(await _run(Sandbox.connect, *a, **kw))

    @staticmethod
    async def list(*a: Any, **kw: Any) -> List[SandboxInfo]:
        """:meth:`Sandbox.list`, awaited."""
        return await _run(Sandbox.list, *a, **kw)

    async def info(self) -> SandboxInfo:
        """:meth:`Sandbox.info`, awaited."""
        return await _run(self.sync.info)

    async def is_running(self) -> bool:
        """:meth:`Sandbox.is_running`, awaited."""
        return await _run(self.sync.is_running)

    async def pause(self, *a: Any, **kw: Any) -> SandboxInfo:
        """:meth:`Sandbox.pause`, awaited."""
        return await _run(self.sync.pause, *a, **kw)

    async def resume(self, *a: Any, **kw: Any) -> SandboxInfo:
        """:meth:`Sandbox.resume`, awaited."""
        return await _run(self.sync.resume, *a, **kw)

    async def fork(self, n: int = 1, timeout: Optional[float] = None) -> List["AsyncSandbox"]:
        """:meth:`Sandbox.fork`, awaited; the children are :class:`AsyncSandbox` too."""
        kids = await _run(self.sync.fork, n, timeout)
        return [AsyncSandbox(k) for k in kids]

    async def snapshot(self, *a: Any, **kw: Any) -> Any:
        """:meth:`Sandbox.snapshot`, awaited."""
        return await _run(self.sync.snapshot, *a, **kw)

    async def snapshots(self) -> Any:
        """:meth:`Sandbox.snapshots`, awaited."""
        return await _run(self.sync.snapshots)

    async def rollback(self, snapshot_id: Any) -> Any:
        """:meth:`Sandbox.rollback`, awaited."""
        return await _run(self.sync.rollback, snapshot_id)

    async def kill(self) -> bool:
        """:meth:`Sandbox.kill`, awaited."""
        return await _run(self.sync.kill)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *a: Any) -> None:
        await self.kill()
