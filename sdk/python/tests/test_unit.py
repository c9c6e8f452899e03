"""Tests that need no daemon: configuration, wire helpers, error mapping,
records; and the whole SDK against tests/fakedaemon.py (a fake
warren-hostd over a unix socket whose "guest" is this machine)."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import os
import sys
import threading
import time
import unittest
from typing import Any
from unittest import mock

# The package (sdk/python) and this folder on sys.path: the tests run without pip.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import warren
from warren import _transport as tr
from warren import exceptions as exc
from warren.models import EntryInfo, SandboxInfo, go_mode_to_unix, parse_time

from fakedaemon import Fake


class ConfigTest(unittest.TestCase):
    def env(self, **kw: str) -> Any:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("WARREN_")}
        clean.update(kw)
        return mock.patch.dict(os.environ, clean, clear=True)

    def test_default_socket_and_tenant(self) -> None:
        with self.env():
            c = tr.ConnectionConfig()
        self.assertEqual(c.scheme, "unix")
        self.assertEqual(c.socket_path, "/run/warren/hostd.sock")
        self.assertEqual(c.headers(), {"X-Warren-Tenant": "default"})

    def test_env(self) -> None:
        with self.env(WARREN_HOST="unix:///tmp/x.sock", WARREN_TENANT="acme", WARREN_TOKEN="sekrit"):
            c = tr.ConnectionConfig()
        self.assertEqual(c.socket_path, "/tmp/x.sock")
        self.assertEqual(c.headers(), {"X-Warren-Tenant": "acme", "Authorization": "Bearer sekrit"})
        self.assertNotIn("sekrit", repr(c))

    def test_arguments_win(self) -> None:
        with self.env(WARREN_HOST="/a.sock", WARREN_TENANT="acme"):
            c = tr.ConnectionConfig(host="/b.sock", tenant="other")
        self.assertEqual((c.socket_path, c.tenant), ("/b.sock", "other"))

    def test_http(self) -> None:
        with self.env():
            c = tr.ConnectionConfig(host="http://10.0.0.1:7070/", token="t")
        self.assertEqual((c.scheme, c.netloc, c.base_path), ("http", "10.0.0.1:7070", ""))
        # On TCP the token's tenant rules: no tenant header unless one is set.
        self.assertEqual(c.headers(), {"Authorization": "Bearer t"})
        with self.env(WARREN_TENANT="acme"):
            c = tr.ConnectionConfig(host="https://warren.example/api", token="t")
        self.assertEqual((c.scheme, c.base_path), ("https", "/api"))
        self.assertEqual(c.headers()["X-Warren-Tenant"], "acme")
        self.assertIsNotNone(c.ssl_context)

    def test_bad(self) -> None:
        with self.env():
            with self.assertRaises(exc.InvalidArgumentError):
                tr.ConnectionConfig(host="http://")
            with self.assertRaises(exc.InvalidArgumentError):
                tr.ConnectionConfig(host="/x.sock", ca_file="/ca.pem")
            with self.assertRaises(exc.InvalidArgumentError):
                tr.ConnectionConfig(host="https://h", cert_file="/c.pem")

    def test_build_path(self) -> None:
        self.assertEqual(tr.build_path("/p"), "/p")
        self.assertEqual(tr.build_path("/p", {"a": None, "b": True, "c": 0, "path": "/a b&c"}), "/p?b=1&c=0&path=%2Fa+b%26c")
        self.assertEqual(tr.seg("a/b c"), "a%2Fb%20c")


class ErrorTest(unittest.TestCase):
    def test_mapping(self) -> None:
        cases = [
            (400, b'{"error":"bad"}', exc.InvalidArgumentError),
            (401, b'{"error":"no token"}', exc.AuthenticationError),
            (403, b'{"error":"no"}', exc.PermissionDeniedError),
            (404, b'{"error":"sandbox \\"x\\" not found"}', exc.NotFoundError),
            (409, b'{"error":"sandbox x is paused"}', exc.ConflictError),
            (409, b'{"error":"exists","code":"exists"}', exc.ConflictError),
            (400, b'{"error":"agent: stat: no such file","code":"not_found"}', exc.NotFoundError),
            (409, b'{"error":"the process has exited","code":"bad_request"}', exc.ConflictError),
            (429, b"", exc.RateLimitError),
            (500, b"boom", exc.ServerError),
            (502, b'{"error":"guest agent: eof"}', exc.ServerError),
        ]
        for st, body, cls in cases:
            e = exc.error_from_response(st, body)
            self.assertIsInstance(e, cls, (st, body))
            self.assertIsInstance(e, exc.WarrenError)
            self.assertEqual(e.status, st)
        e = exc.error_from_response(404, b'{"error":"gone","code":"not_found"}')
        self.assertEqual((e.message, e.code, str(e)), ("gone", "not_found", "gone (404, not_found)"))
        self.assertEqual(exc.error_from_response(500, b"plain text\n").message, "plain text")
        self.assertEqual(exc.error_from_response(503, b"").message, "Service Unavailable")
        t = exc.error_from_response(504, b'{"error":"slow"}')
        self.assertIsInstance(t, TimeoutError)  # the built-in one
        self.assertIsInstance(t, exc.TimeoutError)

    def test_command_exit_error(self) -> None:
        r = warren.CommandResult(stdout="o", stderr="line1\nbad thing\n", exit_code=2)
        e = exc.CommandExitError(r)
        self.assertEqual((e.exit_code, e.stdout, e.stderr, e.error), (2, "o", r.stderr, None))
        self.assertIn("bad thing", str(e))
        t = exc.CommandTimeoutError(warren.CommandResult("", "", 137, "timed out", "SIGKILL", True))
        self.assertIsInstance(t, TimeoutError)
        self.assertIsInstance(t, exc.CommandExitError)


class ModelsTest(unittest.TestCase):
    def test_parse_time(self) -> None:
        t = parse_time("2026-12-04T19:31:48.123456789Z")
        self.assertEqual(t, dt.datetime(2026, 12, 4, 19, 31, 48, 123456, tzinfo=dt.timezone.utc))
        t = parse_time("2026-12-04T19:31:48+02:00")
        assert t is not None
        self.assertEqual(t.utcoffset(), dt.timedelta(hours=2))
        self.assertIsNone(parse_time("0001-01-01T00:00:00Z"))
        self.assertIsNone(parse_time("nope"))
        self.assertIsNone(parse_time(None))

    def test_modes(self) -> None:
        import stat

        self.assertEqual(go_mode_to_unix((1 << 31) | 0o755), stat.S_IFDIR | 0o755)
        self.assertEqual(go_mode_to_unix((1 << 27) | 0o777), stat.S_IFLNK | 0o777)
        self.assertEqual(go_mode_to_unix((1 << 23) | 0o755), stat.S_IFREG | stat.S_ISUID | 0o755)
        d = EntryInfo.from_json({"name": "bin", "size": 4096, "mode": (1 << 31) | 0o755, "mod_time": "2026-01-02T03:04:05Z", "is_dir": True, "path": "/usr/bin"})
        self.assertEqual((d.type, d.mode, d.permissions, d.path), ("dir", 0o755, "rwxr-xr-x", "/usr/bin"))
        link = EntryInfo.from_json({"name": "sh", "mode": (1 << 27) | 0o777, "link": "dash"}, path="/bin/sh")
        self.assertEqual((link.type, link.symlink_target, link.path), ("symlink", "dash", "/bin/sh"))
        f = EntryInfo.from_json({"name": "x", "size": 3, "mode": 0o600})
        self.assertEqual((f.type, f.permissions), ("file", "rw-------"))

    def test_sandbox_info(self) -> None:
        s = SandboxInfo.from_json({"id": "sb-1", "template": "tpl", "status": "running", "env": ["A=1", "B=x=y"], "labels": {"name": "n"},
                                   "mem_mib": 512, "cpus": 1, "created": "2026-01-01T00:00:00Z", "snapshots": [{"name": "s1", "kind": "full"}]})
        self.assertEqual((s.sandbox_id, s.envs, s.metadata, s.snapshots[0].name), ("sb-1", {"A": "1", "B": "x=y"}, {"name": "n"}, "s1"))


class _FakeResp:
    def __init__(self, data: bytes) -> None:
        self.buf = io.BytesIO(data)

    def readline(self, n: int = -1) -> bytes:
        return self.buf.readline(n)


class ReadmeTest(unittest.TestCase):
    def test_code_blocks_compile(self) -> None:
        with open(os.path.join(os.path.dirname(_HERE), "README.md"), encoding="utf-8") as f:
            text = f.read()
        blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
        self.assertGreaterEqual(len(blocks), 2)
        for b in blocks:
            compile(b, "README.md", "exec")


class StreamTest(unittest.TestCase):
    def stream(self, data: bytes) -> tr.Stream:
        return tr.Stream(mock.Mock(sock=None), _FakeResp(data))  # type: ignore[arg-type]

    def test_lines(self) -> None:
        s = self.stream(b'{"start":{"offset":0}}\n\n{"stdout":"aGk="}\n{"exit":0}')
        self.assertEqual(list(s.lines()), [{"start": {"offset": 0}}, {"stdout": "aGk="}, {"exit": 0}])

    def test_bounded(self) -> None:
        s = self.stream(b'{"stdout":"' + b"A" * 100 + b'"}\n')
        with self.assertRaises(exc.StreamError):
            list(s.lines(max_line=50))
        with self.assertRaises(exc.StreamError):
            list(self.stream(b"not json\n").lines())
        with self.assertRaises(exc.StreamError):
            list(self.stream(b"[1]\n").lines())


class FakeTestCase(unittest.TestCase):
    token = ""

    def setUp(self) -> None:
        self.fake = Fake(token=self.token).start()
        self.addCleanup(self.fake.stop)
        self.kw = {"host": self.fake.socket, "tenant": "t1", "token": self.token or None}

    def sandbox(self) -> warren.Sandbox:
        sb = warren.Sandbox.create(template="tpl-1", **self.kw)
        self.addCleanup(sb.kill)
        return sb


class SandboxFakeTest(FakeTestCase):
    def test_create_info_list_connect(self) -> None:
        sb = warren.Sandbox.create(template="tpl-1", envs={"A": "1"}, labels={"name": "web"}, mem_mib=256, cpus=2, timeout=30, **self.kw)
        info = sb.info()
        self.assertEqual((info.sandbox_id, info.status, info.labels, info.envs, info.mem_mib, info.cpus), (sb.sandbox_id, "running", {"name": "web"}, {"A": "1"}, 256, 2))
        self.assertEqual(self.fake.requests[0][2].get("X-Warren-Tenant"), "t1")
        self.assertTrue(sb.is_running())
        self.assertEqual([s.sandbox_id for s in warren.Sandbox.list(labels={"name": "web"}, **self.kw)], [sb.sandbox_id])
        self.assertEqual(warren.Sandbox.list(labels={"name": "other"}, **self.kw), [])
        self.assertEqual(warren.Sandbox.connect(sb.sandbox_id, **self.kw).sandbox_id, sb.sandbox_id)
        self.assertEqual(warren.Sandbox.connect("web", **self.kw).sandbox_id, sb.sandbox_id)
        sb.pause()
        self.assertEqual(sb.info().status, "paused")
        self.assertFalse(sb.is_running())
        again = warren.Sandbox.connect(sb.sandbox_id, **self.kw)  # resumes, as E2B's
        self.assertEqual(again.info().status, "running")
        self.assertTrue(sb.kill())
        self.assertFalse(sb.kill())
        with self.assertRaises(warren.NotFoundError):
            sb.info()
        with self.assertRaises(warren.NotFoundError):
            warren.Sandbox.connect("nope", **self.kw)

    def test_default_template_context_manager_class_kill(self) -> None:
        with warren.Sandbox.create(**self.kw) as sb:
            self.assertEqual(sb.info().template_id, "tpl-1")
        self.assertEqual(warren.Sandbox.list(**self.kw), [])
        sb2 = warren.Sandbox.create(template="tpl-1", **self.kw)
        self.assertTrue(warren.Sandbox.kill(sb2.sandbox_id, **self.kw))
        self.assertFalse(warren.Sandbox.kill(sb2.sandbox_id, **self.kw))
        with self.assertRaises(warren.NotFoundError):
            warren.Sandbox.create(template="tpl-nope", **self.kw)

    def test_snapshots_fork(self) -> None:
        sb = self.sandbox()
        s = sb.snapshot(name="one")
        self.assertEqual((s.name, s.kind), ("one", "full"))
        self.assertEqual([x.name for x in sb.snapshots()], ["one"])
        r = sb.rollback("one")
        self.assertEqual((r.snapshot, r.pages_written), ("one", 10))
        with self.assertRaises(warren.NotFoundError):
            sb.rollback("two")
        kids = sb.fork(n=2)
        self.assertEqual(len(kids), 2)
        for k in kids:
            self.assertEqual(k.info().parent, sb.sandbox_id)
            k.kill()

    def test_connection_error(self) -> None:
        with self.assertRaises(warren.ConnectionError):
            warren.Sandbox.list(host=self.fake.dir + "/nothing.sock")

    def test_async(self) -> None:
        async def main() -> str:
            async with await warren.AsyncSandbox.create(template="tpl-1", **self.kw) as sb:
                r = await sb.commands.run("echo async")
                await sb.files.write("/a.txt", "x")
                self.assertEqual(await sb.files.read("/a.txt"), "x")
                self.assertEqual((await sb.info()).status, "running")
                return r.stdout

        self.assertEqual(asyncio.run(main()), "async\n")
        self.assertEqual(warren.Sandbox.list(**self.kw), [])


class AuthFakeTest(FakeTestCase):
    token = "s3cret"

    def test_token(self) -> None:
        self.sandbox()
        self.assertEqual(self.fake.requests[-1][2].get("Authorization"), "Bearer s3cret")
        with self.assertRaises(warren.AuthenticationError):
            warren.Sandbox.list(host=self.fake.socket, token="wrong")


class CommandsFakeTest(FakeTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.sb = self.sandbox()

    def test_run(self) -> None:
        out, err = [], []
        r = self.sb.commands.run("echo out; echo err >&2", on_stdout=out.append, on_stderr=err.append)
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.error), ("out\n", "err\n", 0, None))
        self.assertEqual(("".join(out), "".join(err)), ("out\n", "err\n"))
        r = self.sb.commands.run(["printf", "%s|%s", "a b", "$HOME"])
        self.assertEqual(r.stdout, "a b|$HOME")
        os.makedirs(self.fake.root + "/work")
        r = self.sb.commands.run('echo "$X"; pwd', envs={"X": "y"}, cwd="/work")
        self.assertEqual(r.stdout.split("\n")[0], "y")
        self.assertTrue(r.stdout.strip().endswith("/guest/work"))

    def test_utf8_split(self) -> None:
        # A multibyte character split across output chunks comes out whole.
        got = []
        r = self.sb.commands.run(["python3", "-c", "import os,time;b='é€'.encode();os.write(1,b[:1]);time.sleep(0.2);os.write(1,b[1:])"], on_stdout=got.append)
        self.assertEqual((r.stdout, "".join(got)), ("é€", "é€"))

    def test_exit_error(self) -> None:
        with self.assertRaises(warren.CommandExitError) as cm:
            self.sb.commands.run("echo partial; echo oops >&2; exit 3")
        e = cm.exception
        self.assertEqual((e.exit_code, e.stdout, e.stderr), (3, "partial\n", "oops\n"))
        with self.assertRaises(warren.CommandTimeoutError) as cm2:
            self.sb.commands.run("sleep 5", timeout=0.3)
        self.assertTrue(cm2.exception.result.timed_out)
        self.assertIsInstance(cm2.exception, TimeoutError)
        with self.assertRaises(warren.NotFoundError):
            self.sb.commands.run(["/no/such/program"])

    def test_background_iterate_list(self) -> None:
        h = self.sb.commands.run("echo one; sleep 0.3; echo two >&2; echo three", background=True, tag="bg")
        self.assertIsInstance(h, warren.CommandHandle)
        self.assertIn(h.id, [p.id for p in self.sb.commands.list()])
        self.assertEqual(self.sb.commands.get(h.pid).tag, "bg")  # a guest pid (int) is looked up
        parts = list(h)
        self.assertIn(("one\n", None, None), parts)
        self.assertIn((None, "two\n", None), parts)
        r = h.wait()
        self.assertEqual((r.stdout, r.stderr), ("one\nthree\n", "two\n"))
        self.assertEqual(self.sb.commands.get(h.id).state, "exited")

    def test_background_callbacks(self) -> None:
        got: list = []
        h = self.sb.commands.run("for i in 1 2 3; do echo $i; sleep 0.1; done", background=True, on_stdout=got.append)
        deadline = time.time() + 5
        while "".join(got) != "1\n2\n3\n" and time.time() < deadline:
            time.sleep(0.05)  # delivered without a wait()
        self.assertEqual("".join(got), "1\n2\n3\n")
        self.assertEqual(h.wait().stdout, "1\n2\n3\n")

    def test_reconnect_broken_stream(self) -> None:
        # Every output stream breaks after one frame: the handle reconnects
        # from the offset it reached, nothing lost or repeated.
        self.fake.break_output_after = 1
        got: list = []
        r = self.sb.commands.run("for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done; echo err >&2", on_stdout=got.append)
        self.assertEqual(r.stdout, "".join(f"line{i}\n" for i in range(1, 6)))
        self.assertEqual("".join(got), r.stdout)
        self.assertEqual(r.stderr, "err\n")
        self.assertGreater(self.fake.output_opens, 3)

    def test_reconnect_across_pause(self) -> None:
        def pause_resume() -> None:
            time.sleep(0.3)
            self.sb.pause()
            time.sleep(1.0)
            self.sb.resume()

        t = threading.Thread(target=pause_resume)
        t.start()
        r = self.sb.commands.run("echo a; sleep 0.6; echo b; sleep 1; echo c")
        t.join()
        self.assertEqual(r.stdout, "a\nb\nc\n")

    def test_connect_new_client(self) -> None:
        h = self.sb.commands.run("echo started; sleep 1; echo done", background=True)
        h.disconnect()
        with self.assertRaises(warren.StreamError):
            h.wait()
        other = warren.Sandbox.connect(self.sb.sandbox_id, **self.kw)
        h2 = other.commands.connect(h.id)
        self.assertEqual(h2.wait().stdout, "started\ndone\n")  # replayed from the start
        h3 = other.commands.connect(h.pid, replay=False)
        self.assertEqual(h3.wait().stdout, "")

    def test_stdin_kill(self) -> None:
        h = self.sb.commands.run("cat", background=True, stdin=True)
        h.send_stdin("hello ")
        self.sb.commands.send_stdin(h.id, b"world")
        h.close_stdin()
        self.assertEqual(h.wait().stdout, "hello world")
        h = self.sb.commands.run("sleep 30", background=True)
        self.assertTrue(self.sb.commands.kill(h.pid))
        with self.assertRaises(warren.CommandExitError) as cm:
            h.wait()
        self.assertEqual((cm.exception.result.signal, cm.exception.error), ("SIGKILL", "killed by SIGKILL"))
        self.assertFalse(h.kill())
        self.assertFalse(self.sb.commands.kill("p-nope"))
        self.assertTrue(self.sb.commands.remove(h.id))
        self.assertNotIn(h.id, [p.id for p in self.sb.commands.list()])

    def test_pty(self) -> None:
        data: list = []
        t = self.sb.pty.create(size=(30, 100), on_data=data.append, cmd=["/bin/sh"])
        self.assertIsInstance(t, warren.PtyHandle)
        t.send_input("stty size\n")
        deadline = time.time() + 5
        while b"30 100" not in b"".join(data) and time.time() < deadline:
            time.sleep(0.05)
        t.resize(40, 120)
        t.send_input(b"stty size; exit\n")
        r = t.wait()
        out = b"".join(data)
        self.assertIn(b"30 100", out)
        self.assertIn(b"40 120", out)
        self.assertEqual(r.exit_code, 0)
        p = self.sb.pty.create(size=warren.PtySize(10, 20), cmd="sleep 30")
        self.assertTrue(self.sb.pty.kill(p.id))
        with self.assertRaises(warren.CommandExitError):
            p.wait(on_pty=lambda b: None)


class FilesFakeTest(FakeTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.sb = self.sandbox()
        self.files = self.sb.files

    def test_read_write(self) -> None:
        info = self.files.write("/hello.txt", "héllo\n")
        self.assertEqual((info.name, info.path, info.type, info.size, info.mode), ("hello.txt", "/hello.txt", "file", 7, 0o644))
        self.assertEqual(self.files.read("/hello.txt"), "héllo\n")
        self.assertEqual(self.files.read("/hello.txt", format="bytes"), "héllo\n".encode())
        self.files.write("/bin.dat", bytes(range(256)), mode=0o600)
        self.assertEqual(self.files.get_info("/bin.dat").permissions, "rw-------")
        self.assertFalse(self.fake.uploads[-1]["chunked"])
        big = os.urandom(3 << 20)
        self.files.write("/big.dat", io.BytesIO(big))  # streamed: chunked, never buffered whole
        self.assertTrue(self.fake.uploads[-1]["chunked"])
        self.assertEqual(self.fake.uploads[-1]["bytes"], len(big))
        with self.files.read("/big.dat", format="stream") as s:
            self.assertEqual(s.mode, 0o644)
            chunks = list(s)
        self.assertGreater(len(chunks), 1)
        self.assertEqual(b"".join(chunks), big)
        self.files.write("/gen.txt", (b"%d," % i for i in range(5)))
        self.assertEqual(self.files.read("/gen.txt"), "0,1,2,3,4,")
        self.files.write("/text.txt", io.StringIO("text file ✓"))
        self.assertEqual(self.files.read("/text.txt"), "text file ✓")
        with self.assertRaises(warren.NotFoundError):
            self.files.read("/nope")
        with self.assertRaises(warren.InvalidArgumentError):
            self.files.read("relative")
        with self.assertRaises(warren.InvalidArgumentError):
            self.files.read("/x", format="json")

    def test_dirs(self) -> None:
        self.assertTrue(self.files.make_dir("/d/e/f"))
        self.assertFalse(self.files.make_dir("/d/e/f"))
        self.files.write("/d/a.txt", "a")
        self.files.write("/d/e/b.txt", "b")
        os.symlink("a.txt", self.fake.root + "/d/link")
        l1 = self.files.list("/d")
        self.assertEqual({(e.name, e.type) for e in l1}, {("a.txt", "file"), ("e", "dir"), ("link", "symlink")})
        l2 = self.files.list("/d", depth=3)
        self.assertIn("/d/e/f", [e.path for e in l2])
        self.assertIn("/d/e/b.txt", [e.path for e in l2])
        self.assertTrue(self.files.exists("/d/a.txt"))
        self.assertFalse(self.files.exists("/d/zzz"))
        self.assertEqual(self.files.get_info("/d/link").symlink_target, "a.txt")
        r = self.files.rename("/d/a.txt", "/d/c.txt")
        self.assertEqual((r.path, r.name), ("/d/c.txt", "c.txt"))
        self.assertFalse(self.files.exists("/d/a.txt"))
        self.files.remove("/d/c.txt")
        self.files.remove("/d")
        self.assertFalse(self.files.exists("/d"))
        with self.assertRaises(warren.NotFoundError):
            self.files.remove("/d")

    def test_watch(self) -> None:
        self.files.make_dir("/w")
        events: list = []
        ended = threading.Event()
        h = self.files.watch_dir("/w", events.append, on_exit=lambda e: ended.set())
        self.assertTrue(h.running)
        self.files.write("/w/new.txt", "1")
        deadline = time.time() + 5
        while not any(e.type == "create" and e.name == "new.txt" for e in events) and time.time() < deadline:
            time.sleep(0.05)
        h.stop()
        self.assertTrue(ended.wait(5))
        self.assertIsNone(h.error)
        ev = [e for e in events if e.type == "create"][0]
        self.assertEqual((ev.path, ev.is_dir), ("/w/new.txt", False))
        self.assertFalse(h.running)
        with self.files.watch_dir("/w") as polled:  # E2B's sync style: no callback, get_new_events()
            self.files.write("/w/two.txt", "2")
            deadline = time.time() + 5
            got: list = []
            while not any(e.name == "two.txt" for e in got) and time.time() < deadline:
                got += polled.get_new_events()
                time.sleep(0.05)
        self.assertTrue(any(e.name == "two.txt" and e.type == "create" for e in got))


if __name__ == "__main__":
    unittest.main()
