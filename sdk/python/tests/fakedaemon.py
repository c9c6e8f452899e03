"""A fake warren-hostd for the unit tests: the daemon's HTTP API over a unix
socket, with the sandbox's "guest" being this machine: processes are real
local processes (pipes or a real pseudo-terminal), files live under a
temporary root. It follows the contract of the daemon's API closely enough
to test the SDK's wire behaviour (NDJSON streams, offsets, reconnects,
chunked uploads, errors) without VMs.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import pty
import shutil
import signal
import socketserver
import struct
import subprocess
import tempfile
import termios
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


GO_DIR = 1 << 31
GO_SYMLINK = 1 << 27


class HTTPErr(Exception):
    def __init__(self, status: int, msg: str, code: str = "") -> None:
        super().__init__(msg)
        self.status, self.msg, self.code = status, msg, code


class Proc:
    def __init__(self, fake: "Fake", pid_id: str, req: Dict[str, Any], root: str) -> None:
        self.id = pid_id
        self.req = req
        self.cond = threading.Condition()
        self.chunks: List[Tuple[int, str, bytes]] = []  # (offset, kind, data)
        self.total = 0
        self.exit: Optional[Dict[str, Any]] = None
        self.started = now()
        self.master: Optional[int] = None
        env = dict(os.environ)
        for kv in req.get("env") or []:
            k, _, v = kv.partition("=")
            env[k] = v
        cwd = req.get("cwd") or None
        if cwd:
            cwd = root + cwd
        self.pty = req.get("pty")
        timeout = (req.get("timeout_ms") or 0) / 1000.0
        self.timed_out = False
        self.readers = 1 if self.pty else 2
        if self.pty:
            master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", self.pty["rows"], self.pty["cols"], 0, 0))
            env.setdefault("TERM", "xterm-256color")

            def pre() -> None:
                os.setsid()
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)

            self.p = subprocess.Popen(req["argv"], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, preexec_fn=pre, close_fds=True)
            os.close(slave)
            self.master = master
            threading.Thread(target=self._read_fd, args=(master, "stdout"), daemon=True).start()
            self.stdin_open = True
        else:
            self.p = subprocess.Popen(
                req["argv"],
                stdin=subprocess.PIPE if req.get("stdin") else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
            self.stdin_open = bool(req.get("stdin"))
            threading.Thread(target=self._read_pipe, args=(self.p.stdout, "stdout"), daemon=True).start()
            threading.Thread(target=self._read_pipe, args=(self.p.stderr, "stderr"), daemon=True).start()
        if timeout:
            def kill_later() -> None:
                time.sleep(timeout)
                if self.p.poll() is None:
                    self.timed_out = True
                    try:
                        os.killpg(self.p.pid, signal.SIGKILL)
                    except OSError:
                        pass
            threading.Thread(target=kill_later, daemon=True).start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _add(self, kind: str, b: bytes) -> None:
        with self.cond:
            self.chunks.append((self.total, kind, b))
            self.total += len(b)
            self.cond.notify_all()

    def _read_pipe(self, f: Any, kind: str) -> None:
        with f:
            while True:
                b = os.read(f.fileno(), 4096)
                if not b:
                    break
                self._add(kind, b)
        with self.cond:
            self.readers -= 1
            self.cond.notify_all()

    def _read_fd(self, fd: int, kind: str) -> None:
        while True:
            try:
                b = os.read(fd, 4096)
            except OSError:
                break
            if not b:
                break
            self._add(kind, b)
        with self.cond:
            self.readers -= 1
            self.cond.notify_all()

    def _wait(self) -> None:
        rc = self.p.wait()
        with self.cond:
            while self.readers > 0:
                self.cond.wait(0.2)
                if self.pty and self.readers > 0:
                    # the terminal's master reads EIO once every slave is closed
                    pass
            if rc < 0:
                self.exit = {"code": 128 - rc, "signal": signal.Signals(-rc).name, "timed_out": self.timed_out}
            else:
                self.exit = {"code": rc, "timed_out": self.timed_out}
            self.cond.notify_all()

    def info(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "id": self.id,
            "pid": self.p.pid,
            "argv": self.req["argv"],
            "state": "exited" if self.exit else "running",
            "started_at": self.started,
            "output_bytes": self.total,
            "output_from": 0,
            "stdin_open": self.stdin_open and not self.exit,
        }
        for k in ("cwd", "user", "tag"):
            if self.req.get(k):
                d[k] = self.req[k]
        if self.pty:
            d["pty"] = self.pty
        if self.exit:
            d["exit"] = self.exit
        return d


class Fake:
    """The fake daemon: ``start()`` it, point the SDK at ``.socket``, ``stop()`` it."""

    def __init__(self, token: str = "") -> None:
        self.dir = tempfile.mkdtemp(prefix="warren-fake-")
        self.socket = os.path.join(self.dir, "hostd.sock")
        self.root = os.path.join(self.dir, "guest")
        os.mkdir(self.root)
        self.token = token
        self.lock = threading.Lock()
        self.sandboxes: Dict[str, Dict[str, Any]] = {}
        self.procs: Dict[str, Proc] = {}  # shared by all sandboxes (a fork child sees its parent's)
        self.templates = [{"id": "tpl-1", "status": "ready"}]
        self.n = 0
        self.requests: List[Tuple[str, str, Dict[str, str]]] = []
        self.uploads: List[Dict[str, Any]] = []
        self.break_output_after: Optional[int] = None  # cut each output stream after N data frames
        self.output_opens = 0
        fake = self

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that went away (the SDK's aborted streams)

        class H(Handler):
            pass

        H.fake = fake
        self.server = Server(self.socket, H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "Fake":
        self.thread.start()
        return self

    def stop(self) -> None:
        for p in list(self.procs.values()):
            if p.p.poll() is None:
                try:
                    os.killpg(p.p.pid, signal.SIGKILL)
                except OSError:
                    pass
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def new_id(self, prefix: str) -> str:
        with self.lock:
            self.n += 1
            return f"{prefix}{self.n}"

    def sandbox(self, sid: str) -> Dict[str, Any]:
        s = self.sandboxes.get(sid)
        if s is None:
            raise HTTPErr(404, f'sandbox "{sid}" not found')
        return s

    def running(self, sid: str) -> Dict[str, Any]:
        s = self.sandbox(sid)
        if s["status"] != "running":
            raise HTTPErr(409, f"sandbox {sid} is {s['status']}")
        return s

    def guest(self, p: str) -> str:
        if not p.startswith("/"):
            raise HTTPErr(400, "path must be absolute")
        return self.root + os.path.normpath(p)

    def file_info(self, real: str, path: str) -> Dict[str, Any]:
        try:
            st = os.lstat(real)
        except FileNotFoundError:
            raise HTTPErr(404, f"agent: stat {path}: no such file or directory", "not_found")
        mode = st.st_mode & 0o777
        import stat as S

        d: Dict[str, Any] = {"name": os.path.basename(path.rstrip("/")) or "/", "size": st.st_size, "mod_time": now(), "is_dir": False, "path": path}
        if S.S_ISDIR(st.st_mode):
            mode |= GO_DIR
            d["is_dir"] = True
        elif S.S_ISLNK(st.st_mode):
            mode |= GO_SYMLINK
            d["link"] = os.readlink(real)
        d["mode"] = mode
        return d


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: Fake

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def address_string(self) -> str:
        return "unix"

    # -- plumbing ----------------------------------------------------------

    def send_json(self, status: int, v: Any) -> None:
        b = json.dumps(v).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def start_stream(self, ctype: str = "application/x-ndjson", extra: Optional[Dict[str, str]] = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def chunk(self, b: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
        self.wfile.flush()

    def line(self, v: Any) -> None:
        self.chunk(json.dumps(v).encode() + b"\n")

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                out.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(out)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def jbody(self) -> Any:
        b = self.body()
        return json.loads(b) if b else {}

    def do_GET(self) -> None:
        self.route("GET")

    def do_POST(self) -> None:
        self.route("POST")

    def do_PUT(self) -> None:
        self.route("PUT")

    def do_DELETE(self) -> None:
        self.route("DELETE")

    def route(self, method: str) -> None:
        f = self.fake
        u = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        parts = [unquote(p) for p in u.path.strip("/").split("/")]
        f.requests.append((method, self.path, dict(self.headers.items())))
        try:
            if f.token and self.headers.get("Authorization") != "Bearer " + f.token:
                raise HTTPErr(401, "a bearer token is required")
            self.dispatch(method, parts, q)
        except HTTPErr as e:
            body = {"error": e.msg}
            if e.code:
                body["code"] = e.code
            self.send_json(e.status, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- the API -----------------------------------------------------------

    def dispatch(self, method: str, parts: List[str], q: Dict[str, str]) -> None:
        f = self.fake
        if parts[:2] == ["v1", "templates"] and method == "GET":
            return self.send_json(200, f.templates)
        if parts[:2] != ["v1", "sandboxes"]:
            raise HTTPErr(404, "404 page not found")
        if len(parts) == 2:
            if method == "POST":
                req = self.jbody()
                if req.get("template") not in [t["id"] for t in f.templates]:
                    raise HTTPErr(404, f'template "{req.get("template")}" not found')
                sid = f.new_id("sb-")
                rec = {"id": sid, "tenant": self.headers.get("X-Warren-Tenant", ""), "template": req["template"], "status": "running",
                       "api": "/x", "vsock": "/y", "mem_mib": req.get("mem_mib", 512), "cpus": req.get("cpus", 1),
                       "env": req.get("env"), "labels": req.get("labels"), "created": now(), "updated": now()}
                f.sandboxes[sid] = rec
                return self.send_json(200, rec)
            return self.send_json(200, list(f.sandboxes.values()))
        sid = parts[2]
        rest = parts[3:]
        if not rest:
            s = f.sandbox(sid)
            if method == "DELETE":
                del f.sandboxes[sid]
                return self.send_json(200, {"deleted": sid})
            return self.send_json(200, s)
        op = rest[0]
        if op == "pause":
            s = f.running(sid)
            s["status"] = "suspended" if q.get("to_disk") == "true" else "paused"
            return self.send_json(200, s)
        if op == "resume":
            s = f.sandbox(sid)
            s["status"] = "running"
            return self.send_json(200, s)
        if op == "snapshots":
            s = f.sandbox(sid)
            if method == "POST":
                req = self.jbody()
                snap = {"name": req.get("name") or "snap-1", "path": "/p", "kind": "incremental" if req.get("incremental") else "full", "time": now()}
                s.setdefault("snapshots", []).append(snap)
                return self.send_json(200, snap)
            return self.send_json(200, {"rolling": None, "snapshots": s.get("snapshots") or []})
        if op == "rollback":
            s = f.running(sid)
            req = self.jbody()
            if req.get("snapshot") not in [x["name"] for x in s.get("snapshots") or []]:
                raise HTTPErr(404, f"snapshot {req.get('snapshot')!r} not found")
            return self.send_json(200, {"snapshot": req["snapshot"], "pause_ms": 1.5, "total_ms": 2, "load_ms": 1, "pages_written": 10, "pages_cleared": 2, "line": "rolled back"})
        if op == "fork":
            s = f.running(sid)
            n = self.jbody().get("n") or 1
            kids = []
            for _ in range(n):
                cid = f.new_id("sb-")
                c = dict(s, id=cid, parent=sid)
                f.sandboxes[cid] = c
                kids.append(c)
            return self.send_json(200, {"children": kids, "parent": sid, "pause_ms": 3})
        if op == "processes":
            return self.processes(method, sid, rest[1:], q)
        if op == "files":
            return self.files(method, sid, rest[1:], q)
        raise HTTPErr(404, "404 page not found")

    def proc(self, pid: str) -> Proc:
        p = self.fake.procs.get(pid)
        if p is None:
            raise HTTPErr(404, f"agent: process {pid} not found", "not_found")
        return p

    def processes(self, method: str, sid: str, rest: List[str], q: Dict[str, str]) -> None:
        f = self.fake
        f.running(sid)
        if not rest:
            if method == "POST":
                req = self.jbody()
                if not req.get("argv"):
                    raise HTTPErr(400, "argv is required", "bad_request")
                if not shutil.which(req["argv"][0]):
                    raise HTTPErr(404, f"agent: {req['argv'][0]}: not found", "not_found")
                p = Proc(f, f.new_id("p"), req, f.root)
                f.procs[p.id] = p
                return self.send_json(200, p.info())
            return self.send_json(200, [p.info() for p in f.procs.values()])
        p = self.proc(rest[0])
        sub = rest[1] if len(rest) > 1 else ""
        if sub == "" and method == "GET":
            return self.send_json(200, p.info())
        if sub == "" and method == "DELETE":
            if p.exit is None:
                os.killpg(p.p.pid, signal.SIGKILL)
            del f.procs[p.id]
            return self.send_json(200, {"deleted": p.id})
        if sub == "output":
            return self.output(p, q)
        if sub == "stdin":
            b = self.body()
            if not p.stdin_open:
                raise HTTPErr(409, "stdin is closed", "bad_request")
            if p.master is not None:
                os.write(p.master, b)
            else:
                assert p.p.stdin is not None
                p.p.stdin.write(b)
                p.p.stdin.flush()
                if q.get("eof") == "1":
                    p.p.stdin.close()
                    p.stdin_open = False
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if sub == "signal":
            sig = self.jbody().get("signal", "SIGTERM")
            if p.exit is not None:
                raise HTTPErr(409, "the process has exited", "bad_request")
            name = sig if sig.startswith("SIG") else "SIG" + sig
            os.killpg(p.p.pid, signal.Signals[name])
            return self.send_json(200, p.info())
        if sub == "resize":
            req = self.jbody()
            if p.master is None:
                raise HTTPErr(400, "no terminal", "bad_request")
            fcntl.ioctl(p.master, termios.TIOCSWINSZ, struct.pack("HHHH", req["rows"], req["cols"], 0, 0))
            p.pty = {"rows": req["rows"], "cols": req["cols"]}
            return self.send_json(200, p.info())
        if sub == "wait":
            with p.cond:
                while p.exit is None:
                    p.cond.wait()
            return self.send_json(200, p.info())
        raise HTTPErr(404, "404 page not found")

    def output(self, p: Proc, q: Dict[str, str]) -> None:
        f = self.fake
        f.output_opens += 1
        follow = q.get("follow", "1") == "1"
        off = int(q["offset"]) if "offset" in q and int(q["offset"]) >= 0 else 0
        self.start_stream()
        self.line({"start": {"offset": off}})
        sent = 0
        while True:
            with p.cond:
                todo = [(o, k, b) for (o, k, b) in p.chunks if o + len(b) > off]
                if not todo and p.exit is None and follow:
                    p.cond.wait(0.5)
                    if self.fake.sandboxes.get(next(iter(self.fake.sandboxes), ""), {}).get("status") == "paused":
                        pass
                    continue
                exit_ = p.exit if not todo else None
            for o, k, b in todo:
                data = b[off - o:] if off > o else b
                if f.break_output_after is not None and sent >= f.break_output_after:
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.line({k: base64.b64encode(data).decode()})
                off += len(data)
                sent += 1
            if exit_ is not None:
                self.line({"exit": exit_["code"], **({"signal": exit_["signal"]} if exit_.get("signal") else {}), **({"timed_out": True} if exit_.get("timed_out") else {})})
                return self.end_stream()
            if not follow and not todo:
                return self.end_stream()

    def files(self, method: str, sid: str, rest: List[str], q: Dict[str, str]) -> None:
        f = self.fake
        f.running(sid)
        op = rest[0] if rest else ""
        path = q.get("path", "")
        if op == "" and method == "GET":
            real = f.guest(path)
            if not os.path.exists(real):
                raise HTTPErr(404, f"agent: open {path}: no such file or directory", "not_found")
            if os.path.isdir(real):
                raise HTTPErr(400, f"{path} is a directory")
            self.start_stream("application/octet-stream", {"X-Warren-Mode": format(os.stat(real).st_mode & 0o777, "o")})
            with open(real, "rb") as fh:
                while True:
                    b = fh.read(100_000)
                    if not b:
                        break
                    self.chunk(b)
            return self.end_stream()
        if op == "" and method == "PUT":
            real = f.guest(path)
            chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
            b = self.body()
            f.uploads.append({"path": path, "chunked": chunked, "bytes": len(b)})
            if not os.path.isdir(os.path.dirname(real)):
                raise HTTPErr(404, f"agent: open {path}: no such file or directory", "not_found")
            with open(real, "wb") as fh:
                fh.write(b)
            os.chmod(real, int(q.get("mode") or "644", 8))
            return self.send_json(200, f.file_info(real, path))
        if op == "" and method == "DELETE":
            real = f.guest(path)
            if not os.path.lexists(real):
                raise HTTPErr(404, f"agent: remove {path}: no such file or directory", "not_found")
            if os.path.isdir(real) and not os.path.islink(real):
                if q.get("recursive") == "1":
                    shutil.rmtree(real)
                else:
                    os.rmdir(real)
            else:
                os.unlink(real)
            return self.send_json(200, {"deleted": path})
        if op == "stat":
            return self.send_json(200, f.file_info(f.guest(path), path))
        if op == "list":
            depth = int(q.get("depth") or 1)
            base = f.guest(path)
            if not os.path.isdir(base):
                raise HTTPErr(404, f"agent: {path}: not found", "not_found")
            out = []

            def walk(real: str, gp: str, d: int) -> None:
                for name in sorted(os.listdir(real)):
                    r, g = os.path.join(real, name), gp.rstrip("/") + "/" + name
                    out.append(f.file_info(r, g))
                    if d > 1 and os.path.isdir(r) and not os.path.islink(r):
                        walk(r, g, d - 1)

            walk(base, path, depth)
            return self.send_json(200, out)
        if op == "mkdir":
            real = f.guest(path)
            if q.get("parents") == "1":
                os.makedirs(real, int(q.get("mode") or "755", 8), exist_ok=True)
            else:
                if os.path.exists(real):
                    raise HTTPErr(409, f"agent: mkdir {path}: file exists", "exists")
                os.mkdir(real, int(q.get("mode") or "755", 8))
            return self.send_json(200, f.file_info(real, path))
        if op == "rename":
            req = self.jbody()
            src, dst = f.guest(req["from"]), f.guest(req["to"])
            if not os.path.lexists(src):
                raise HTTPErr(404, f"agent: rename {req['from']}: no such file or directory", "not_found")
            os.rename(src, dst)
            return self.send_json(200, f.file_info(dst, req["to"]))
        if op == "watch":
            base = f.guest(path)
            rec = q.get("recursive") == "1"

            def snap() -> Dict[str, Tuple[float, bool]]:
                out: Dict[str, Tuple[float, bool]] = {}
                for dirpath, dirs, files in os.walk(base):
                    for n in dirs + files:
                        r = os.path.join(dirpath, n)
                        try:
                            out[r] = (os.stat(r).st_mtime_ns, os.path.isdir(r))
                        except OSError:
                            pass
                    if not rec:
                        break
                return out

            self.start_stream()
            self.line({"op": "ready", "path": path, "time": now()})
            old = snap()
            try:
                while True:
                    time.sleep(0.05)
                    cur = snap()
                    for r, (m, isdir) in cur.items():
                        g = path.rstrip("/") + r[len(base):]
                        if r not in old:
                            self.line({"op": "create", "path": g, "is_dir": isdir, "time": now()})
                        elif old[r][0] != m and not isdir:
                            self.line({"op": "write", "path": g, "time": now()})
                    for r, (m, isdir) in old.items():
                        if r not in cur:
                            self.line({"op": "remove", "path": path.rstrip("/") + r[len(base):], "is_dir": isdir, "time": now()})
                    old = cur
            except OSError:
                return
        raise HTTPErr(404, "404 page not found")
