"""The sandbox: ``Sandbox.create``, ``Sandbox.connect``, and what a sandbox does."""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Sequence, Type, TypeVar, Union

from . import exceptions as exc
from ._transport import LONG_OPERATION_TIMEOUT, ConnectionConfig, Transport, seg
from .commands import Commands, Pty, _Procs
from .files import Files
from .models import RollbackInfo, SandboxInfo, SnapshotInfo

__all__ = ["Sandbox"]

T = TypeVar("T")


class _ClassOrInstance(Generic[T]):
    """A method callable on the class (with the sandbox's id first) or on an instance, as E2B's ``Sandbox.kill``."""

    def __init__(self, inst: Callable[..., T], cls_fn: Callable[..., T]) -> None:
        self._inst = inst
        self._cls = cls_fn
        functools.update_wrapper(self, inst)  # type: ignore[arg-type]

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., T]:
        if obj is None:
            return functools.partial(self._cls, objtype)
        return functools.partial(self._inst, obj)


def _long(timeout: Optional[float]) -> float:
    return timeout if timeout is not None else LONG_OPERATION_TIMEOUT


def _conn(
    host: Optional[str], tenant: Optional[str], token: Optional[str], request_timeout: Optional[float], config: Optional[ConnectionConfig]
) -> ConnectionConfig:
    if config is not None:
        return config
    kw: Dict[str, Any] = {}
    if request_timeout is not None:
        kw["request_timeout"] = request_timeout
    return ConnectionConfig(host=host, tenant=tenant, token=token, **kw)


def _kill_class(
    cls: Type["Sandbox"],
    sandbox_id: str,
    host: Optional[str] = None,
    tenant: Optional[str] = None,
    token: Optional[str] = None,
    config: Optional[ConnectionConfig] = None,
) -> bool:
    """``Sandbox.kill(sandbox_id, ...)``: kill a sandbox by its id."""
    return cls(sandbox_id, _conn(host, tenant, token, None, config))._kill_instance()


class Sandbox:
    """A Warren sandbox: a microVM restored from a template.

    Make one with :meth:`create`, or reach an existing one with
    :meth:`connect`. ``with Sandbox.create(...) as sb:`` kills it on exit.

    Attributes:
        sandbox_id: its id.
        commands: run commands, manage processes (:class:`Commands`).
        pty: processes on terminals (:class:`Pty`).
        files: its guest files (:class:`Files`).
        connection: how it reaches the daemon.
    """

    def __init__(self, sandbox_id: str, connection: ConnectionConfig, info: Optional[SandboxInfo] = None) -> None:
        """Wrap an existing sandbox; use :meth:`create` or :meth:`connect` instead."""
        self.sandbox_id = sandbox_id
        self.connection = connection
        self._t = Transport(connection)
        self._info = info
        procs = _Procs(self._t, sandbox_id)
        self.commands = Commands(procs)
        self.pty = Pty(procs)
        self.files = Files(self._t, sandbox_id)

    def __repr__(self) -> str:
        return f"Sandbox(sandbox_id={self.sandbox_id!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *a: Any) -> None:
        self.kill()

    def _path(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{seg(self.sandbox_id)}{rest}"

    # -- making and finding ------------------------------------------------

    @classmethod
    def create(
        cls: Type["Sandbox"],
        template: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        mem_mib: Optional[int] = None,
        cpus: Optional[int] = None,
        timeout: Optional[float] = None,
        host: Optional[str] = None,
        tenant: Optional[str] = None,
        token: Optional[str] = None,
        egress: Union[Mapping[str, Any], str, None] = None,
        secrets: Optional[Sequence[str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        request_timeout: Optional[float] = None,
        config: Optional[ConnectionConfig] = None,
    ) -> "Sandbox":
        """Create a sandbox from a template and return it once it runs.

        Args:
            template: the template's id; ``None`` takes the tenant's only
                ready template (an error if there are none or several).
            envs: environment variables every process of the sandbox gets.
            labels: free-form labels (``"name"`` is how the CLI finds a
                sandbox by name). ``metadata`` is E2B's name for them.
            mem_mib, cpus: its VMM's cgroup limits (default the template's;
                the guest's own size is the template's).
            timeout: seconds the create request may take (default 600:
                the daemon bounds its own steps). Unlike E2B's ``timeout`` this is
                *not* the sandbox's lifetime: a Warren sandbox runs until it
                is killed (``kill()``, or leaving the ``with`` block).
            host, tenant, token: the daemon and who to act as (default
                ``$WARREN_HOST``, ``$WARREN_TENANT``, ``$WARREN_TOKEN``).
            egress: the egress policy (an ebpf/policy document, a dict or
                JSON text; the template needs a network).
            secrets: names of the tenant's secrets its egress credentials use.
            request_timeout: seconds later plain calls of this sandbox may take.
            config: a :class:`ConnectionConfig` instead of host, tenant, token.
        """
        conn = _conn(host, tenant, token, request_timeout, config)
        t = Transport(conn)
        if template is None:
            ready = [d["id"] for d in t.call("GET", "/v1/templates") or [] if d.get("status") == "ready"]
            if len(ready) != 1:
                raise exc.InvalidArgumentError(
                    f"no template given and the tenant has {len(ready)} ready templates ({', '.join(ready)}): name one"
                )
            template = ready[0]
        body: Dict[str, Any] = {"template": template}
        if envs:
            body["env"] = [f"{k}={v}" for k, v in envs.items()]
        lab = dict(metadata or {})
        lab.update(labels or {})
        if lab:
            body["labels"] = lab
        if mem_mib:
            body["mem_mib"] = int(mem_mib)
        if cpus:
            body["cpus"] = int(cpus)
        if egress is not None:
            body["egress"] = json.loads(egress) if isinstance(egress, str) else dict(egress)
        if secrets:
            body["secrets"] = list(secrets)
        d = t.call("POST", "/v1/sandboxes", json_body=body, timeout=_long(timeout))
        info = SandboxInfo.from_json(d or {})
        if info.status == "failed":
            raise exc.ServerError(f"sandbox {info.sandbox_id} failed: {info.reason or 'no reason given'}", 500)
        return cls(info.sandbox_id, conn, info)

    @classmethod
    def connect(
        cls: Type["Sandbox"],
        sandbox_id: str,
        host: Optional[str] = None,
        tenant: Optional[str] = None,
        token: Optional[str] = None,
        resume: bool = True,
        request_timeout: Optional[float] = None,
        config: Optional[ConnectionConfig] = None,
    ) -> "Sandbox":
        """Reach an existing sandbox by its id (or its ``"name"`` label).

        As with E2B, a paused (or suspended, or stopped) sandbox is resumed
        unless ``resume=False``. Raises :class:`NotFoundError`.
        """
        conn = _conn(host, tenant, token, request_timeout, config)
        t = Transport(conn)
        try:
            d = t.call("GET", f"/v1/sandboxes/{seg(sandbox_id)}")
        except exc.NotFoundError:
            named = [s for s in t.call("GET", "/v1/sandboxes") or [] if (s.get("labels") or {}).get("name") == sandbox_id]
            if len(named) != 1:
                raise
            d = named[0]
        sb = cls(str(d["id"]), conn, SandboxInfo.from_json(d))
        if resume and sb._info is not None and sb._info.status in ("paused", "suspended", "stopped"):
            sb.resume()
        return sb

    @staticmethod
    def list(
        labels: Optional[Mapping[str, str]] = None,
        state: Optional[Sequence[str]] = None,
        host: Optional[str] = None,
        tenant: Optional[str] = None,
        token: Optional[str] = None,
        config: Optional[ConnectionConfig] = None,
    ) -> List[SandboxInfo]:
        """The tenant's sandboxes, oldest first.

        ``labels`` keeps those with all these labels; ``state`` those in one
        of these statuses (``"running"``, ``"paused"``, ...).
        """
        t = Transport(_conn(host, tenant, token, None, config))
        out = []
        for d in t.call("GET", "/v1/sandboxes") or []:
            info = SandboxInfo.from_json(d)
            if labels and any(info.labels.get(k) != v for k, v in labels.items()):
                continue
            if state and info.status not in state:
                continue
            out.append(info)
        return out

    # -- state -------------------------------------------------------------

    def info(self) -> SandboxInfo:
        """The sandbox's record now (``get_info`` in E2B)."""
        self._info = SandboxInfo.from_json(self._t.call("GET", self._path()) or {})
        return self._info

    get_info = info

    def is_running(self) -> bool:
        """Whether the sandbox runs (not paused, suspended, stopped or gone)."""
        try:
            return self.info().status == "running"
        except exc.NotFoundError:
            return False

    # -- lifecycle ---------------------------------------------------------

    def pause(self, to_disk: bool = False, timeout: Optional[float] = None) -> SandboxInfo:
        """Pause the sandbox in memory, or with ``to_disk`` snapshot it and stop its VMM (``"suspended"``).

        Its processes are paused with it and go on after :meth:`resume`.
        """
        q = {"to_disk": "true"} if to_disk else None
        d = self._t.call("POST", self._path("/pause"), q, timeout=_long(timeout))
        self._info = SandboxInfo.from_json(d or {})
        return self._info

    def resume(self, timeout: Optional[float] = None) -> SandboxInfo:
        """Resume a paused sandbox, or restore a suspended or stopped one from its latest snapshot."""
        d = self._t.call("POST", self._path("/resume"), timeout=_long(timeout))
        self._info = SandboxInfo.from_json(d or {})
        return self._info

    def fork(self, n: int = 1, timeout: Optional[float] = None) -> List["Sandbox"]:
        """Fork the running sandbox into ``n`` children (1 to 64) and return them.

        Each child is a copy of the sandbox at this instant, its processes
        included. If fewer than ``n`` were made, :class:`ForkError` says
        why and carries the ones that were.
        """
        d = self._t.call("POST", self._path("/fork"), json_body={"n": int(n)}, timeout=_long(timeout))
        d = d or {}
        kids = []
        for c in d.get("children") or []:
            info = SandboxInfo.from_json(c)
            if info.status != "failed" and info.sandbox_id:
                kids.append(type(self)(info.sandbox_id, self.connection, info))
        errors = [str(e) for e in d.get("errors") or []]
        if errors or len(kids) < n:
            raise exc.ForkError(f"fork of {self.sandbox_id}: {len(kids)} of {n} children: {'; '.join(errors)}", kids, errors)
        return kids

    def snapshot(self, name: Optional[str] = None, incremental: bool = False, timeout: Optional[float] = None) -> SnapshotInfo:
        """Take a snapshot now (``name`` defaults to ``snap-<UTC time>``); :meth:`rollback` goes back to it."""
        body: Dict[str, Any] = {}
        if name:
            body["name"] = name
        if incremental:
            body["incremental"] = True
        return SnapshotInfo.from_json(self._t.call("POST", self._path("/snapshots"), json_body=body, timeout=_long(timeout)) or {})

    def snapshots(self) -> List[SnapshotInfo]:
        """The sandbox's snapshots, oldest first."""
        d = self._t.call("GET", self._path("/snapshots")) or {}
        return [SnapshotInfo.from_json(s) for s in d.get("snapshots") or []]

    def rollback(self, snapshot_id: Union[str, SnapshotInfo], timeout: Optional[float] = None) -> RollbackInfo:
        """Put the running sandbox back to one of its snapshots, in place (its processes too)."""
        name = snapshot_id.name if isinstance(snapshot_id, SnapshotInfo) else snapshot_id
        return RollbackInfo.from_json(self._t.call("POST", self._path("/rollback"), json_body={"snapshot": name}, timeout=_long(timeout)) or {})

    def _kill_instance(self) -> bool:
        try:
            self._t.call("DELETE", self._path())
        except exc.NotFoundError:
            return False
        return True

    kill = _ClassOrInstance(_kill_instance, _kill_class)
    """Stop the sandbox and delete everything of it: ``sb.kill()`` or ``Sandbox.kill(sandbox_id, host=...)``.

    Returns ``False`` if it was already gone.
    """
