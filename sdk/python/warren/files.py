"""A sandbox's guest files: ``sandbox.files`` (E2B's ``Filesystem``).

Paths are the guest's, absolute. Reads and writes stream: ``read(...,
format="stream")`` hands back the download as it comes, and ``write`` of a
file-like object uploads it in chunks (chunked transfer encoding), never
holding the whole file in memory.
"""

from __future__ import annotations

import queue
import threading
from typing import IO, Any, Callable, Iterable, Iterator, List, Literal, Optional, Union, overload

from . import exceptions as exc
from ._transport import Stream, Transport, seg
from .models import EntryInfo, FilesystemEvent

__all__ = ["Files", "ReadStream", "WatchHandle"]

WriteData = Union[str, bytes, bytearray, memoryview, IO[bytes], IO[str], Iterable[bytes]]
"""What ``files.write`` takes: text (written as UTF-8), bytes, a file-like object or an iterable of bytes chunks."""


class ReadStream:
    """A guest file's download as it comes (``files.read(path, format="stream")``).

    Iterate it for chunks of bytes, or ``read(n)`` it like a file; close it
    (or use ``with``) when done early.

    Attributes:
        mode: the file's permission bits, from the daemon.
    """

    def __init__(self, stream: Stream, chunk_size: int = 64 << 10) -> None:
        self._s = stream
        self.chunk_size = chunk_size
        m = stream.headers.get("X-Warren-Mode") or ""
        try:
            self.mode: Optional[int] = int(m, 8)
        except ValueError:
            self.mode = None

    def read(self, n: int = -1) -> bytes:
        """Read up to ``n`` bytes (all the rest when ``n`` < 0); ``b""`` at the end."""
        return self._s.read(n)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            b = self._s.read1(self.chunk_size)
            if not b:
                self.close()
                return
            yield b

    def close(self) -> None:
        """Close the download."""
        self._s.close()

    def __enter__(self) -> "ReadStream":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


class WatchHandle:
    """A watch of a guest directory (``files.watch_dir``): a thread reads the events until :meth:`stop`."""

    def __init__(self, stream: Stream, thread: threading.Thread, state: "_WatchState") -> None:
        self._stream = stream
        self._thread = thread
        self._state = state

    def get_new_events(self) -> List[FilesystemEvent]:
        """The events since the last call (E2B's sync API), for a watch made without ``on_event``."""
        out: List[FilesystemEvent] = []
        while True:
            try:
                out.append(self._state.events.get_nowait())
            except queue.Empty:
                return out

    @property
    def running(self) -> bool:
        """The watch still delivers events."""
        return self._thread.is_alive()

    @property
    def error(self) -> Optional[BaseException]:
        """Why the watch ended, if it ended by itself (the stream broke, the sandbox stopped)."""
        return self._state.error

    def stop(self) -> None:
        """Stop watching (closes the stream and joins the thread)."""
        self._state.stopped = True
        self._stream.abort()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        self._stream.close()

    def __enter__(self) -> "WatchHandle":
        return self

    def __exit__(self, *a: Any) -> None:
        self.stop()


class _WatchState:
    def __init__(self) -> None:
        self.stopped = False
        self.error: Optional[BaseException] = None
        self.ready = threading.Event()
        self.events: "queue.Queue[FilesystemEvent]" = queue.Queue()


class Files:
    """``sandbox.files``: read, write, list and watch the sandbox's guest files."""

    def __init__(self, transport: Transport, sandbox_id: str) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id

    def _path(self, op: str = "") -> str:
        return f"/v1/sandboxes/{seg(self.sandbox_id)}/files" + (f"/{op}" if op else "")

    @overload
    def read(self, path: str, format: Literal["text"] = "text", request_timeout: Optional[float] = None) -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"], request_timeout: Optional[float] = None) -> bytes: ...

    @overload
    def read(self, path: str, format: Literal["stream"], request_timeout: Optional[float] = None) -> ReadStream: ...

    @overload
    def read(self, path: str, format: str = "text", request_timeout: Optional[float] = None) -> Union[str, bytes, ReadStream]: ...

    def read(self, path: str, format: str = "text", request_timeout: Optional[float] = None) -> Union[str, bytes, ReadStream]:
        """Read a guest file.

        Args:
            path: the file's absolute guest path.
            format: ``"text"`` (``str``, UTF-8), ``"bytes"`` or ``"stream"``
                (a :class:`ReadStream`: iterate it for chunks).
            request_timeout: seconds the download may stall (default the connection's).

        Raises:
            NotFoundError: no such file.
            InvalidArgumentError: a directory, or a relative path.
        """
        if format not in ("text", "bytes", "stream"):
            raise exc.InvalidArgumentError(f'format {format!r}: want "text", "bytes" or "stream"')
        timeout: Any = request_timeout if request_timeout is not None else "default"
        s = self._t.open("GET", self._path(), {"path": path}, timeout=timeout)
        if format == "stream":
            return ReadStream(s)
        with s:
            data = s.read()
        return data.decode("utf-8") if format == "text" else data

    def write(self, path: str, data: WriteData, mode: Optional[int] = None, request_timeout: Optional[float] = None) -> EntryInfo:
        """Write (create or replace) a guest file.

        ``data`` is text (UTF-8), bytes, a file-like object (binary or
        text) or an iterable of bytes: the last two are uploaded in chunks
        as they are read. ``mode`` is the permission bits (default 0o644).
        Returns the file's :class:`EntryInfo` (E2B returns a ``WriteInfo``
        with name, type and path: all here too).
        """
        q = {"path": path, "mode": format(mode & 0o7777, "o") if mode is not None else None}
        body: Any = data.encode("utf-8") if isinstance(data, str) else data
        timeout: Any = request_timeout if request_timeout is not None else "default"
        d = self._t.call("PUT", self._path(), q, body=body, timeout=timeout)
        return EntryInfo.from_json(d or {}, path=path)

    def list(self, path: str, depth: int = 1) -> List[EntryInfo]:
        """The entries under a guest directory, ``depth`` levels down (1: its own entries; at most 32), parents before children."""
        q = {"path": path, "depth": depth if depth and depth > 0 else None}
        return [EntryInfo.from_json(d) for d in self._t.call("GET", self._path("list"), q) or []]

    def get_info(self, path: str) -> EntryInfo:
        """A guest file's :class:`EntryInfo` (a symbolic link's own). Raises :class:`NotFoundError`."""
        return EntryInfo.from_json(self._t.call("GET", self._path("stat"), {"path": path}) or {}, path=path)

    def exists(self, path: str) -> bool:
        """Whether the guest path exists."""
        try:
            self.get_info(path)
        except exc.NotFoundError:
            return False
        return True

    def make_dir(self, path: str, mode: int = 0o755) -> bool:
        """Create a guest directory and its missing parents; ``False`` if it already existed (as E2B's)."""
        if self.exists(path):
            return False
        q = {"path": path, "parents": 1, "mode": format(mode & 0o7777, "o")}
        self._t.call("POST", self._path("mkdir"), q)
        return True

    def remove(self, path: str, recursive: bool = True) -> None:
        """Remove a guest file or directory (with everything under it unless ``recursive=False``)."""
        self._t.call("DELETE", self._path(), {"path": path, "recursive": 1 if recursive else None})

    def rename(self, old_path: str, new_path: str) -> EntryInfo:
        """Rename a guest file (``rename(2)``: an existing ``new_path`` is replaced); returns the new path's info."""
        d = self._t.call("POST", self._path("rename"), json_body={"from": old_path, "to": new_path})
        return EntryInfo.from_json(d or {}, path=new_path)

    def watch_dir(
        self,
        path: str,
        on_event: Optional[Callable[[FilesystemEvent], Any]] = None,
        recursive: bool = False,
        on_exit: Optional[Callable[[Optional[BaseException]], Any]] = None,
        ready_timeout: Optional[float] = 30.0,
    ) -> WatchHandle:
        """Watch a guest directory; ``on_event`` gets each change from a thread until ``stop()``.

        Without ``on_event`` the events are kept for ``get_new_events()``
        (E2B's synchronous style).

        Returns once the watches are in place (the stream's ``ready``
        line), so a change made after it returns is seen. ``on_exit`` is
        called when the watch ends, with the error if it ended by itself.
        """
        s = self._t.open("GET", self._path("watch"), {"path": path, "recursive": 1 if recursive else None}, timeout=None)
        state = _WatchState()

        def run() -> None:
            try:
                for doc in s.lines(1 << 20):
                    if doc.get("error"):
                        raise exc.StreamError(f"watch {path}: {doc['error']}")
                    if doc.get("op") == "ready":
                        state.ready.set()
                        continue
                    ev = FilesystemEvent.from_json(doc, path)
                    if on_event is not None:
                        on_event(ev)
                    else:
                        state.events.put(ev)
                if not state.stopped:
                    raise exc.StreamError(f"watch {path}: the stream ended")
            except BaseException as e:
                if not state.stopped:
                    state.error = e
            finally:
                state.ready.set()
                s.close()
                if on_exit:
                    on_exit(state.error)

        t = threading.Thread(target=run, name=f"warren-watch-{path}", daemon=True)
        t.start()
        h = WatchHandle(s, t, state)
        if not state.ready.wait(ready_timeout):
            h.stop()
            raise exc.TimeoutError(f"watch {path}: not ready after {ready_timeout} s")
        if state.error is not None:
            raise state.error
        return h
