// End-to-end tests against a real warren-hostd with real VMs: sdk/test.sh
// sets WARREN_HOST, WARREN_TENANT and WARREN_TEST_TEMPLATE (a template of
// the Debian image: sh, bash, coreutils' stty, python3). Without
// WARREN_TEST_TEMPLATE they are skipped.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import {
  Sandbox,
  CommandExitError,
  CommandTimeoutError,
  NotFoundError,
} from '../dist/index.js';

const TEMPLATE = process.env.WARREN_TEST_TEMPLATE;
const skip = TEMPLATE
  ? false
  : 'WARREN_TEST_TEMPLATE is unset: the end-to-end tests need a real daemon and a template (run `bash sdk/test.sh js` from the repository root)';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// until polls fn until it is true, for at most ms (generous: the CI's
// nested VMs are slow); what may be a function, for a message saying more.
async function until(what, fn, ms = 60_000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) assert.fail(`timed out waiting for ${typeof what === 'function' ? what() : what}`);
    await sleep(100);
  }
}

describe('end to end (real daemon, real VMs)', { skip, timeout: 15 * 60_000 }, () => {
  /** @type {Sandbox} */
  let sbx;
  const extra = []; // other sandboxes to kill at the end

  before(async () => {
    sbx = await Sandbox.create({ template: TEMPLATE, envs: { SDK_ENV: 'from-create' }, labels: { suite: 'sdk-js' } });
  });

  // killChildren kills the fork children of the suite's sandbox (a failed
  // fork's too: a parent with children cannot be deleted).
  async function killChildren() {
    if (!sbx) return;
    const kids = (await Sandbox.list()).filter((s) => s.parent === sbx.sandboxId);
    for (const k of kids) await Sandbox.kill(k.sandboxId).catch(() => {});
  }

  after(async () => {
    for (const s of extra) await s.kill().catch(() => {});
    await killChildren().catch(() => {});
    if (sbx) await sbx.kill().catch(() => {});
  });

  it('create, getInfo, list, connect', async () => {
    assert.ok(sbx.sandboxId);
    const info = await sbx.getInfo();
    assert.equal(info.status, 'running');
    assert.equal(info.templateId, TEMPLATE);
    assert.equal(info.labels.suite, 'sdk-js');
    const l = await Sandbox.list({ query: { labels: { suite: 'sdk-js' } } });
    assert.ok(l.some((s) => s.sandboxId === sbx.sandboxId));
    const again = await Sandbox.connect(sbx.sandboxId);
    assert.equal(again.sandboxId, sbx.sandboxId);
    assert.equal(await again.isRunning(), true);
  });

  it('commands.run: output, envs, cwd, stdin, exit codes, timeout', async () => {
    const outs = [];
    const r = await sbx.commands.run('echo hello; echo "$SDK_ENV $MINE"; pwd; echo err >&2', {
      envs: { MINE: 'mine' },
      cwd: '/tmp',
      onStdout: (d) => outs.push(d),
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'hello\nfrom-create mine\n/tmp\n');
    assert.equal(r.stderr, 'err\n');
    assert.equal(outs.join(''), r.stdout);
    const argv = await sbx.commands.run(['python3', '-c', 'import sys; print(sys.argv[1:])', 'a b', 'c']);
    assert.equal(argv.stdout, "['a b', 'c']\n");
    const cat = await sbx.commands.run('tr a-z A-Z', { stdin: 'shout\n' });
    assert.equal(cat.stdout, 'SHOUT\n');
    await assert.rejects(sbx.commands.run('echo out; echo bad >&2; exit 3'), (e) => {
      assert.ok(e instanceof CommandExitError);
      assert.equal(e.exitCode, 3);
      assert.equal(e.stdout, 'out\n');
      assert.equal(e.stderr, 'bad\n');
      return true;
    });
    await assert.rejects(sbx.commands.run('echo before; sleep 30', { timeoutMs: 5000 }), (e) => {
      assert.ok(e instanceof CommandTimeoutError);
      assert.equal(e.result.timedOut, true);
      // A slow guest may not have got to the echo within the timeout.
      assert.ok(['', 'before\n'].includes(e.result.stdout), JSON.stringify(e.result.stdout));
      return true;
    });
    // Large output, across many frames.
    const big = await sbx.commands.run('head -c 300000 /dev/zero | tr "\\0" x');
    assert.equal(big.stdout.length, 300000);
  });

  it('background: handle, stdin, iteration, kill', async () => {
    const h = await sbx.commands.run('while read l; do echo "got $l"; done; echo eof', { background: true, stdin: true });
    assert.equal(typeof h.id, 'string');
    assert.ok(h.id);
    assert.ok(Number.isInteger(h.pid) && h.pid > 0, `guest pid ${h.pid}`);
    assert.equal((await sbx.commands.getInfo(h.pid)).id, h.id);
    await h.sendStdin('one\n');
    await h.sendStdin('two\n');
    await h.closeStdin();
    const chunks = [];
    for await (const c of h) chunks.push(c.data);
    assert.equal(chunks.join(''), 'got one\ngot two\neof\n');
    assert.equal((await h.wait()).exitCode, 0);

    const long = await sbx.commands.run('sleep 60', { background: true });
    assert.equal(await long.kill(), true);
    await assert.rejects(long.wait(), (e) => e instanceof CommandExitError && e.error === 'killed by SIGKILL');
    const info = await sbx.commands.getInfo(long.id);
    assert.equal(info.state, 'exited');
  });

  it('reconnect: a new client reads a background command started by a client that is gone', async () => {
    // The first client is another Node process: it starts the command and exits.
    const index = fileURLToPath(new URL('../dist/index.js', import.meta.url));
    const script = `
      import { Sandbox } from ${JSON.stringify(index)};
      const s = await Sandbox.connect(${JSON.stringify(sbx.sandboxId)});
      const h = await s.commands.run('echo started; sleep 3; echo done', { background: true });
      await h.disconnect();
      process.stdout.write(h.id);
      process.exit(0);
    `;
    const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(child.status, 0, child.stderr);
    const id = child.stdout.trim();
    assert.ok(id);
    const s2 = await Sandbox.connect(sbx.sandboxId);
    const l = await s2.commands.list();
    assert.ok(l.some((p) => p.id === id && Number.isInteger(p.pid)), `list has ${id}`);
    const outs = [];
    const h = await s2.commands.connect(id, { onStdout: (d) => outs.push(d) });
    const r = await h.wait();
    assert.equal(r.stdout, 'started\ndone\n');
    assert.equal(outs.join(''), 'started\ndone\n');
    // And from now on (not from the start): only what comes after.
    const h2 = await s2.commands.run('sleep 1; echo late', { background: true });
    await h2.disconnect();
    const h3 = await s2.commands.connect(h2.id, { fromStart: false });
    assert.equal((await h3.wait()).stdout, 'late\n');
    await assert.rejects(s2.commands.connect('no-such-process'), NotFoundError);
  });

  it('files: write, read, list, mkdir, rename, remove, watch', async () => {
    const f = sbx.files;
    assert.equal(await f.makeDir('/tmp/sdk/sub'), true);
    assert.equal(await f.makeDir('/tmp/sdk/sub'), false);
    const events = [];
    const w = await f.watchDir('/tmp/sdk', (e) => events.push(e), { recursive: true });
    const e1 = await f.write('/tmp/sdk/a.txt', 'héllo\n');
    assert.equal(e1.path, '/tmp/sdk/a.txt');
    assert.equal(e1.type, 'file');
    assert.equal(await f.read('/tmp/sdk/a.txt'), 'héllo\n');
    const bytes = new Uint8Array(256).map((_, i) => i);
    await f.write('/tmp/sdk/sub/b.bin', bytes, { mode: 0o600 });
    assert.deepEqual(await f.read('/tmp/sdk/sub/b.bin', { format: 'bytes' }), bytes);
    // Streamed both ways.
    await f.write('/tmp/sdk/c.txt', Readable.from((function* () { for (let i = 0; i < 100; i++) yield Buffer.from(`line ${i}\n`); })()));
    const st = await f.read('/tmp/sdk/c.txt', { format: 'stream' });
    let text = '';
    for await (const c of st) text += c.toString();
    assert.equal(text.split('\n').length, 101);
    const info = await f.getInfo('/tmp/sdk/sub/b.bin');
    assert.equal(info.size, 256);
    assert.equal(info.mode, 0o600);
    assert.equal(info.permissions, 'rw-------');
    const l1 = await f.list('/tmp/sdk');
    assert.deepEqual(l1.map((e) => [e.name, e.type]).sort(), [['a.txt', 'file'], ['c.txt', 'file'], ['sub', 'dir']]);
    const l2 = await f.list('/tmp/sdk', { depth: 2 });
    assert.ok(l2.some((e) => e.path === '/tmp/sdk/sub/b.bin'), JSON.stringify(l2.map((e) => e.path)));
    const moved = await f.rename('/tmp/sdk/a.txt', '/tmp/sdk/sub/moved.txt');
    assert.equal(moved.name, 'moved.txt');
    assert.equal(await f.exists('/tmp/sdk/a.txt'), false);
    assert.equal(await f.exists('/tmp/sdk/sub/moved.txt'), true);
    await until('the watch events', () => events.some((e) => e.path === '/tmp/sdk/sub/b.bin' && (e.type === 'create' || e.type === 'write')));
    assert.ok(events.some((e) => e.name === 'a.txt' && e.type === 'create'), JSON.stringify(events));
    await w.stop();
    await f.remove('/tmp/sdk');
    assert.equal(await f.exists('/tmp/sdk'), false);
    await assert.rejects(f.read('/tmp/sdk/none'), NotFoundError);
    await assert.rejects(f.getInfo('/nonexistent'), NotFoundError);
  });

  it('pty: stty size answers the size set, and resize', async () => {
    const out = [];
    const p = await sbx.pty.create({ rows: 33, cols: 101, cmd: 'stty size', onData: (d) => out.push(Buffer.from(d)) });
    const r = await p.wait();
    assert.equal(r.exitCode, 0);
    assert.match(Buffer.concat(out).toString(), /33 101/);

    const t = await sbx.pty.create({ rows: 24, cols: 80 });
    await t.resize({ rows: 40, cols: 120 });
    await t.sendInput('stty size\n');
    await until(() => `"40 120" in the terminal's output: ${JSON.stringify(t.stdout)}`, () => /40 120/.test(t.stdout));
    await t.sendInput('exit\n');
    assert.equal((await t.wait()).exitCode, 0);
  });

  it('pause/resume: a background command goes on after', async () => {
    const h = await sbx.commands.run('echo before; sleep 4; echo survived', { background: true });
    await until('output before the pause', () => h.stdout.includes('before'));
    const p = await sbx.pause();
    assert.equal(p.status, 'paused');
    assert.equal(await sbx.isRunning(), false);
    await sleep(500);
    const r = await sbx.resume();
    assert.equal(r.status, 'running');
    const l = await sbx.commands.list();
    const me = l.find((x) => x.id === h.id);
    assert.ok(me, 'the command is listed after the resume');
    assert.equal(me.state, 'running');
    const res = await h.wait();
    assert.equal(res.stdout, 'before\nsurvived\n');
  });

  it('fork: the child lists the parent\'s process; snapshot and rollback', async () => {
    const h = await sbx.commands.run('sleep 120', { background: true });
    const [child] = await sbx.fork(1);
    extra.push(child);
    assert.notEqual(child.sandboxId, sbx.sandboxId);
    assert.equal((await child.getInfo()).parent, sbx.sandboxId);
    const l = await child.commands.list();
    assert.ok(l.some((p) => p.id === h.id && p.pid === h.pid && p.state === 'running'), JSON.stringify(l.map((p) => [p.id, p.pid, p.state])));
    assert.equal((await child.commands.run('echo child')).stdout, 'child\n');
    assert.equal(await child.kill(), true);
    await h.kill();

    await sbx.files.write('/tmp/marker', 'one');
    const snap = await sbx.snapshot({ name: 'sdk-js-snap' });
    assert.equal(snap.name, 'sdk-js-snap');
    await sbx.files.write('/tmp/marker', 'two');
    assert.ok((await sbx.snapshots()).some((s) => s.name === 'sdk-js-snap'));
    await sbx.rollback(snap);
    assert.equal(await sbx.files.read('/tmp/marker'), 'one');
  });

  it('the README quickstart runs as written', async () => {
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    const m = readme.split('## Quickstart')[1].match(/```js\n([\s\S]*?)```/);
    assert.ok(m, 'a js block in the Quickstart section');
    const index = pathToFileURL(fileURLToPath(new URL('../dist/index.js', import.meta.url))).href;
    const code = m[1].replace("'@warrenvm/sdk'", JSON.stringify(index));
    const dir = mkdtempSync(join(tmpdir(), 'warren-quickstart-'));
    try {
      writeFileSync(join(dir, 'quickstart.mjs'), code);
      const r = spawnSync(process.execPath, [join(dir, 'quickstart.mjs')], {
        encoding: 'utf8',
        timeout: 180_000,
        env: { ...process.env, TEMPLATE: TEMPLATE },
      });
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /^hello from Linux\nhi there\n[\s\S]*file greeting\.txt[\s\S]*\ndone\n$/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('kill', async () => {
    await killChildren();
    assert.equal(await sbx.kill(), true);
    await assert.rejects(sbx.getInfo(), NotFoundError);
    assert.equal(await Sandbox.kill(sbx.sandboxId), false);
    sbx = undefined;
  });
});
