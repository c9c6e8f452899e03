"""End-to-end tests against a real warren-hostd with real VMs.

sdk/test.sh runs them with WARREN_HOST (the daemon's socket),
WARREN_TENANT and WARREN_TEST_TEMPLATE (a Debian template with Python,
bash and coreutils) set; without WARREN_TEST_TEMPLATE they are skipped.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
import unittest
from typing import Callable, List

# The package (sdk/python) and this folder on sys.path: the tests run without pip.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import warren

TEMPLATE = os.environ.get("WARREN_TEST_TEMPLATE", "")
SKIP = "WARREN_TEST_TEMPLATE is unset: the end-to-end tests need a real daemon and template (run them with: bash sdk/test.sh python)"


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# The defaults a long-running server must outlive: the SDK's request
# timeout (60 s), E2B's default command timeout (60 s) and the daemon's
# reply timeout for one agent answer (agentclient.DefaultLimits, 2 min).
SERVER_OUTLIVES = 130.0


@unittest.skipUnless(TEMPLATE, SKIP)
class E2ETest(unittest.TestCase):
    sb: warren.Sandbox
    server: warren.CommandHandle
    server_started: float

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = warren.Sandbox.create(template=TEMPLATE, envs={"SDK_TEST": "py"}, labels={"sdk": "python"}, timeout=180)
        # A server for test_9: it must outlive every default timeout.
        cls.server = cls.sb.commands.run("python3 -m http.server 8000 --bind 127.0.0.1", background=True)
        cls.server_started = time.monotonic()

    @classmethod
    def tearDownClass(cls) -> None:
        # Fork children first: the daemon keeps a parent whose disk layers they use.
        for s in warren.Sandbox.list():
            if s.parent == cls.sb.sandbox_id:
                warren.Sandbox.kill(s.sandbox_id)
        cls.sb.kill()

    def test_1_run(self) -> None:
        sb = self.sb
        self.assertEqual(sb.info().status, "running")
        self.assertIn(sb.sandbox_id, [s.sandbox_id for s in warren.Sandbox.list(labels={"sdk": "python"})])
        out: List[str] = []
        r = sb.commands.run("echo hello $SDK_TEST; echo oops >&2", on_stdout=out.append)
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("hello py\n", "oops\n", 0))
        self.assertEqual("".join(out), "hello py\n")
        r = sb.commands.run(["python3", "-c", "import os,sys; print(os.getcwd(), os.environ['K'])"], cwd="/tmp", envs={"K": "v"})
        self.assertEqual(r.stdout, "/tmp v\n")
        with self.assertRaises(warren.CommandExitError) as cm:
            sb.commands.run("echo no >&2; exit 7")
        self.assertEqual((cm.exception.exit_code, cm.exception.stderr), (7, "no\n"))
        with self.assertRaises(warren.CommandTimeoutError):
            sb.commands.run("sleep 30", timeout=1)
        h = sb.commands.run("cat", background=True, stdin=True)
        h.send_stdin("to stdin")
        h.close_stdin()
        self.assertEqual(h.wait().stdout, "to stdin")

    def test_2_background_reconnect(self) -> None:
        sb = self.sb
        h = sb.commands.run("echo started; sleep 3; echo done", background=True, tag="reconnect")
        pid, gpid = h.id, h.pid
        h.disconnect()
        del h
        # A new client, a new handle: the output is replayed from the start.
        other = warren.Sandbox.connect(sb.sandbox_id)
        procs = {p.id: p for p in other.commands.list()}
        self.assertIn(pid, procs)
        self.assertEqual((procs[pid].tag, procs[pid].pid), ("reconnect", gpid))
        got: List[str] = []
        h2 = other.commands.connect(pid, on_stdout=got.append)
        r = h2.wait()
        self.assertEqual(r.stdout, "started\ndone\n")
        self.assertEqual("".join(got), "started\ndone\n")
        self.assertEqual(other.commands.get(pid).state, "exited")
        # kill
        k = sb.commands.run("sleep 300", background=True)
        self.assertTrue(sb.commands.kill(k.pid))
        with self.assertRaises(warren.CommandExitError) as cm:
            k.wait()
        self.assertEqual(cm.exception.result.signal, "SIGKILL")
        self.assertFalse(k.kill())
        self.assertTrue(sb.commands.remove(k.id))

    def test_3_files(self) -> None:
        f = self.sb.files
        self.assertTrue(f.make_dir("/tmp/sdk/sub"))
        self.assertFalse(f.make_dir("/tmp/sdk/sub"))
        events: List[warren.FilesystemEvent] = []
        w = f.watch_dir("/tmp/sdk", events.append, recursive=True)
        try:
            info = f.write("/tmp/sdk/a.txt", "héllo")
            self.assertEqual((info.size, info.type), (6, "file"))
            self.assertEqual(f.read("/tmp/sdk/a.txt"), "héllo")
            big = os.urandom(2 << 20)
            f.write("/tmp/sdk/sub/big.bin", io.BytesIO(big), mode=0o600)
            with f.read("/tmp/sdk/sub/big.bin", format="stream") as s:
                self.assertEqual(b"".join(s), big)
            self.assertEqual(f.get_info("/tmp/sdk/sub/big.bin").permissions, "rw-------")
            names = {(e.name, e.type) for e in f.list("/tmp/sdk")}
            self.assertEqual(names, {("a.txt", "file"), ("sub", "dir")})
            self.assertIn("/tmp/sdk/sub/big.bin", [e.path for e in f.list("/tmp/sdk", depth=2)])
            f.rename("/tmp/sdk/a.txt", "/tmp/sdk/b.txt")
            self.assertFalse(f.exists("/tmp/sdk/a.txt"))
            self.assertTrue(f.exists("/tmp/sdk/b.txt"))
            wait_for(lambda: any(e.type == "create" and e.path == "/tmp/sdk/sub/big.bin" for e in events), what="the watch's create event")
        finally:
            w.stop()
        self.assertTrue(any(e.path == "/tmp/sdk/a.txt" for e in events))
        f.remove("/tmp/sdk")
        self.assertFalse(f.exists("/tmp/sdk"))
        with self.assertRaises(warren.NotFoundError):
            f.read("/tmp/sdk/b.txt")

    def test_4_pty(self) -> None:
        data: List[bytes] = []
        t = self.sb.pty.create(size=(33, 111), on_data=data.append)
        t.send_input("stty size\n")
        wait_for(lambda: b"33 111" in b"".join(data), what="stty size in the terminal")
        t.resize(44, 122)
        t.send_input(b"stty size; exit\n")
        r = t.wait()
        self.assertEqual(r.exit_code, 0)
        self.assertIn(b"44 122", b"".join(data))

    def test_5_pause_resume_fork(self) -> None:
        sb = self.sb
        h = sb.commands.run("for i in $(seq 1 8); do echo tick$i; sleep 1; done", background=True)
        # A foreground run whose stream the pause breaks: it reconnects from its offset.
        fg: List[warren.CommandResult] = []
        fg_err: List[BaseException] = []

        def foreground() -> None:
            try:
                fg.append(sb.commands.run("for i in 1 2 3 4 5; do echo fg$i; sleep 1; done"))
            except BaseException as e:
                fg_err.append(e)

        t = threading.Thread(target=foreground)
        t.start()
        time.sleep(1.5)
        self.assertEqual(sb.pause().status, "paused")
        time.sleep(1)
        self.assertEqual(sb.resume().status, "running")
        t.join(120)
        self.assertEqual(fg_err, [])
        self.assertEqual(fg[0].stdout, "".join(f"fg{i}\n" for i in range(1, 6)))
        self.assertEqual(sb.commands.get(h.id).state, "running")  # still running after the resume
        try:
            kids = sb.fork(n=1)
        except warren.ForkError as e:
            for k in e.children:
                k.kill()
            raise
        try:
            self.assertEqual(len(kids), 1)
            child = kids[0]
            self.assertEqual(child.info().parent, sb.sandbox_id)
            self.assertIn(h.id, [p.id for p in child.commands.list()])  # the child has the parent's process
            rc = child.commands.connect(h.id).wait()
            self.assertTrue(rc.stdout.endswith("tick8\n"), rc.stdout)
        finally:
            for k in kids:
                k.kill()
        r = h.wait()
        self.assertEqual(r.stdout, "".join(f"tick{i}\n" for i in range(1, 9)))

    def test_6_snapshot_rollback(self) -> None:
        sb = self.sb
        sb.files.write("/tmp/state", "before")
        snap = sb.snapshot(name="sdk-snap")
        self.assertIn("sdk-snap", [s.name for s in sb.snapshots()])
        sb.files.write("/tmp/state", "after")
        sb.rollback(snap)
        self.assertEqual(sb.files.read("/tmp/state"), "before")

    def test_7_kill(self) -> None:
        s = warren.Sandbox.create(template=TEMPLATE, timeout=180)
        with s:
            self.assertEqual(s.commands.run("echo ok").stdout, "ok\n")
        self.assertFalse(s.kill())
        with self.assertRaises(warren.NotFoundError):
            s.info()

    def test_8_readme_quickstart(self) -> None:
        # The README's quickstart runs as written (TEMPLATE set as it says).
        with open(os.path.join(os.path.dirname(_HERE), "README.md"), encoding="utf-8") as f:
            text = f.read()
        code = text.split("## Quickstart", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
        old = os.environ.get("TEMPLATE")
        os.environ["TEMPLATE"] = TEMPLATE
        try:
            exec(compile(code, "README.md quickstart", "exec"), {"__name__": "quickstart"})
        finally:
            if old is None:
                del os.environ["TEMPLATE"]
            else:
                os.environ["TEMPLATE"] = old

    def test_9_server_outlives_default_timeouts(self) -> None:
        sb, server = self.sb, self.server
        left = SERVER_OUTLIVES - (time.monotonic() - self.server_started)
        if left > 0:
            time.sleep(left)
        info = sb.commands.get(server.id)
        self.assertEqual(info.state, "running", info)
        r = sb.commands.run(["python3", "-c", "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/').status)"])
        self.assertEqual(r.stdout, "200\n")
        self.assertTrue(server.kill())


if __name__ == "__main__":
    unittest.main()
