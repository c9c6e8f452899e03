// Tests against a fake daemon on a unix socket (no VMs): the requests the
// SDK sends, and its handling of the answers: a broken output stream
// resumed from the offset reached, errors, timeouts, streamed uploads,
// watches.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { Sandbox, NotFoundError, CommandExitError, TimeoutError, ConflictError, InvalidArgumentError } from '../dist/index.js';

const b64 = (s) => Buffer.from(s).toString('base64');
const dir = mkdtempSync(join(tmpdir(), 'warren-js-fake-'));
const sock = join(dir, 'hostd.sock');
const seen = []; // [method, url, headers, body]
let outputCalls = 0;
let server;

const sandbox = {
  id: 'sb1',
  tenant: 'tt',
  template: 'tpl1',
  status: 'running',
  mem_mib: 512,
  cpus: 1,
  created: '2026-12-04T10:00:00Z',
  updated: '2026-12-04T10:00:00Z',
};
const proc = (id, extra = {}) => ({
  id,
  pid: 42,
  argv: ['/bin/sh', '-c', 'x'],
  state: 'running',
  started_at: '2026-12-04T10:00:00Z',
  output_bytes: 0,
  output_from: 0,
  ...extra,
});

function json(res, status, v) {
  res.writeHead(status, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify(v));
}

before(async () => {
  server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks).toString();
    seen.push([req.method, req.url, req.headers, body]);
    const u = new URL(req.url, 'http://x');
    const p = u.pathname;
    if (req.headers['x-warren-tenant'] !== 'tt') return json(res, 403, { error: 'wrong tenant' });
    if (req.method === 'GET' && p === '/v1/templates') return json(res, 200, [{ id: 'tpl1', status: 'ready' }, { id: 'tpl0', status: 'failed' }]);
    if (req.method === 'POST' && p === '/v1/sandboxes') return json(res, 200, sandbox);
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1') return json(res, 200, sandbox);
    if (req.method === 'GET' && p === '/v1/sandboxes') return json(res, 200, [sandbox, { ...sandbox, id: 'sb2', labels: { name: 'web' } }]);
    if (req.method === 'GET' && p.startsWith('/v1/sandboxes/') && p.split('/').length === 4) return json(res, 404, { error: `sandbox ${p.split('/')[3]} not found` });
    if (req.method === 'POST' && p === '/v1/sandboxes/sb1/processes') {
      const r = JSON.parse(body);
      return json(res, 200, proc(r.argv[2] === 'exit 2' ? 'fail' : 'p1'));
    }
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1/processes/fail/output') {
      res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
      return res.end(`{"start":{"offset":0}}\n{"stderr":"${b64('oops\n')}"}\n{"exit":2}\n`);
    }
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1/processes/p1/output') {
      outputCalls++;
      res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
      if (outputCalls === 1) {
        // Half the output, then the connection breaks.
        res.write(`{"start":{"offset":0}}\n{"stdout":"${b64('hé')}"}\n`);
        setTimeout(() => res.destroy(), 20);
        return;
      }
      if (outputCalls === 2) {
        // The daemon says the stream broke (a rollback): reconnect.
        return res.end(`{"start":{"offset":${u.searchParams.get('offset')}}}\n{"error":"sandbox sb1 was rolled back: reconnect"}\n`);
      }
      const off = Number(u.searchParams.get('offset'));
      return res.end(`{"start":{"offset":${off}}}\n{"stdout":"${b64('llo\n')}"}\n{"stderr":"${b64('warn')}"}\n{"exit":0}\n`);
    }
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1/processes/p1') return json(res, 200, proc('p1', { output_bytes: 7 }));
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1/processes/gone') return json(res, 404, { error: 'no process gone' });
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1/processes') return json(res, 200, [proc('p1'), proc('p2', { state: 'exited', exit: { code: 0 } })]);
    if (req.method === 'POST' && p === '/v1/sandboxes/sb1/processes/p1/stdin') {
      res.writeHead(204);
      return res.end();
    }
    if (req.method === 'POST' && p === '/v1/sandboxes/sb1/processes/p1/signal') return json(res, 200, proc('p1'));
    if (req.method === 'POST' && p === '/v1/sandboxes/sb1/processes/done/signal') return json(res, 409, { error: 'process done has exited' });
    if (req.method === 'PUT' && p === '/v1/sandboxes/sb1/files')
      return json(res, 200, { name: 'f.txt', size: body.length, mode: 0o644, mod_time: '2026-12-04T10:00:00Z', is_dir: false });
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1/files') {
      if (u.searchParams.get('path') === '/nope') return json(res, 404, { error: 'no such file', code: 'not_found' });
      res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'X-Warren-Mode': '644' });
      return res.end('contents');
    }
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1/files/stat') {
      if (u.searchParams.get('path') === '/d') return json(res, 200, { name: 'd', size: 0, mode: 2 ** 31 + 0o755, mod_time: '2026-12-04T10:00:00Z', is_dir: true });
      return json(res, 404, { error: 'no such file', code: 'not_found' });
    }
    if (req.method === 'POST' && p === '/v1/sandboxes/sb1/files/mkdir')
      return json(res, 200, { name: 'n', size: 0, mode: 2 ** 31 + 0o755, mod_time: '2026-12-04T10:00:00Z', is_dir: true });
    if (req.method === 'GET' && p === '/v1/sandboxes/sb1/files/watch') {
      res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
      res.write(`{"op":"ready","path":"/w","time":"2026-12-04T10:00:00Z"}\n`);
      setTimeout(() => res.write(`{"op":"create","path":"/w/a/b.txt","time":"2026-12-04T10:00:01Z"}\n`), 20);
      return; // stays open
    }
    if (req.method === 'POST' && p === '/v1/sandboxes/sb1/pause') return; // never answers
    if (req.method === 'POST' && p === '/v1/sandboxes/sb1/fork')
      return json(res, 200, { parent: 'sb1', children: [{ ...sandbox, id: 'c1', parent: 'sb1' }, { ...sandbox, id: 'c2', status: 'failed' }], errors: ['c2: no memory'] });
    if (req.method === 'DELETE' && p === '/v1/sandboxes/sb1') return json(res, 200, { deleted: 'sb1' });
    json(res, 404, { error: `no route ${req.method} ${p}` });
  });
  await new Promise((r) => server.listen(sock, r));
});

after(async () => {
  server.closeAllConnections?.();
  await new Promise((r) => server.close(r));
  rmSync(dir, { recursive: true, force: true });
});

const opts = () => ({ host: sock, tenant: 'tt' });

test('create: the only ready template, envs and labels on the wire', async () => {
  const sbx = await Sandbox.create({ ...opts(), envs: { A: '1' }, metadata: { m: 'x' }, labels: { name: 'web' }, memMiB: 256 });
  assert.equal(sbx.sandboxId, 'sb1');
  const [, , headers, body] = seen.findLast((s) => s[0] === 'POST' && s[1] === '/v1/sandboxes');
  assert.deepEqual(JSON.parse(body), { template: 'tpl1', env: ['A=1'], labels: { m: 'x', name: 'web' }, mem_mib: 256 });
  assert.equal(headers['content-type'], 'application/json');
  assert.equal(headers['x-warren-tenant'], 'tt');
});

test('connect: by id, by name label; NotFoundError otherwise', async () => {
  assert.equal((await Sandbox.connect('sb1', opts())).sandboxId, 'sb1');
  assert.equal((await Sandbox.connect('web', opts())).sandboxId, 'sb2');
  await assert.rejects(Sandbox.connect('nope', opts()), NotFoundError);
  await assert.rejects(Sandbox.connect('sb1', { host: sock, tenant: 'other' }), /wrong tenant/);
});

test('list filters on labels', async () => {
  const l = await Sandbox.list({ ...opts(), query: { metadata: { name: 'web' } } });
  assert.deepEqual(l.map((s) => s.sandboxId), ['sb2']);
  assert.equal((await Sandbox.list(opts())).length, 2);
});

test('run: a broken output stream resumes from the offset reached', async () => {
  outputCalls = 0;
  const sbx = new Sandbox('sb1', (await Sandbox.connect('sb1', opts())).connectionConfig);
  const outs = [];
  const r = await sbx.commands.run('echo héllo', { onStdout: (d) => outs.push(d), envs: { X: 'y' }, cwd: '/tmp', timeoutMs: 5000 });
  assert.equal(r.stdout, 'héllo\n');
  assert.equal(r.stderr, 'warn');
  assert.equal(r.exitCode, 0);
  assert.equal(outs.join(''), 'héllo\n');
  assert.equal(outputCalls, 3);
  const outputs = seen.filter((s) => s[1].startsWith('/v1/sandboxes/sb1/processes/p1/output')).map((s) => new URL(s[1], 'http://x').searchParams);
  assert.equal(outputs.at(-3).get('offset'), '0');
  // "hé" is 3 bytes: both reconnects ask from offset 3.
  assert.equal(outputs.at(-2).get('offset'), '3');
  assert.equal(outputs.at(-1).get('offset'), '3');
  assert.equal(outputs.at(-1).get('follow'), '1');
  const start = seen.findLast((s) => s[0] === 'POST' && s[1] === '/v1/sandboxes/sb1/processes');
  assert.deepEqual(JSON.parse(start[3]), { argv: ['/bin/sh', '-c', 'echo héllo'], env: ['X=y'], cwd: '/tmp', timeout_ms: 5000 });
});

test('run: a non-zero exit rejects with CommandExitError', async () => {
  const sbx = await Sandbox.connect('sb1', opts());
  await assert.rejects(sbx.commands.run('exit 2'), (e) => e instanceof CommandExitError && e.exitCode === 2 && e.stderr === 'oops\n');
});

test('background: handle, iteration, stdin, kill, list, connect', async () => {
  outputCalls = 2; // the next output call answers all
  const sbx = await Sandbox.connect('sb1', opts());
  const h = await sbx.commands.run(['cat'], { background: true, stdin: true });
  // As the Python SDK's handle: id is the process's id in the sandbox, pid the guest's.
  assert.equal(h.id, 'p1');
  assert.equal(h.pid, 42);
  assert.equal('guestPid' in h, false);
  const started = seen.findLast((s) => s[0] === 'POST' && s[1] === '/v1/sandboxes/sb1/processes');
  assert.deepEqual(JSON.parse(started[3]), { argv: ['cat'], stdin: true });
  await h.sendStdin('in');
  await h.closeStdin();
  const stdins = seen.filter((s) => s[1].startsWith('/v1/sandboxes/sb1/processes/p1/stdin'));
  assert.deepEqual(stdins.slice(-2).map((s) => [s[1], s[3]]), [
    ['/v1/sandboxes/sb1/processes/p1/stdin', 'in'],
    ['/v1/sandboxes/sb1/processes/p1/stdin?eof=1', ''],
  ]);
  const chunks = [];
  for await (const c of h) chunks.push(c);
  assert.deepEqual(chunks, [
    { stream: 'stdout', data: 'llo\n' },
    { stream: 'stderr', data: 'warn' },
  ]);
  assert.equal((await h.wait()).exitCode, 0);
  assert.equal(await h.kill(), true);
  assert.deepEqual(JSON.parse(seen.findLast((s) => s[1].endsWith('/signal'))[3]), { signal: 'SIGKILL' });
  assert.equal(await sbx.commands.kill('done'), false);
  const l = await sbx.commands.list();
  assert.deepEqual(l.map((p) => [p.id, p.pid, p.state, p.exitCode]), [['p1', 42, 'running', undefined], ['p2', 42, 'exited', 0]]);
  await assert.rejects(sbx.commands.connect('gone'), NotFoundError);
});

test('connect: replays by default, from now with fromStart: false, by guest pid', async () => {
  const sbx = await Sandbox.connect('sb1', opts());
  outputCalls = 2;
  const h = await sbx.commands.connect(42); // the running process with guest pid 42: p1 (p2, exited, had it too)
  assert.equal(h.id, 'p1');
  assert.equal(h.pid, 42);
  assert.equal((await h.wait()).stdout, 'llo\n');
  let q = new URL(seen.findLast((s) => s[1].includes('/p1/output'))[1], 'http://x').searchParams;
  assert.equal(q.get('offset'), null);
  outputCalls = 2;
  await (await sbx.commands.connect('p1', { fromStart: false })).wait();
  q = new URL(seen.findLast((s) => s[1].includes('/p1/output'))[1], 'http://x').searchParams;
  assert.equal(q.get('offset'), '7');
  await assert.rejects(sbx.commands.connect(7), NotFoundError);
  // Every process call takes the guest pid too, looked up; kill says false for an unknown one, as for an unknown id.
  const before = seen.length;
  assert.equal(await sbx.commands.kill(42), true);
  assert.ok(seen.slice(before).some((s) => s[0] === 'POST' && s[1] === '/v1/sandboxes/sb1/processes/p1/signal'));
  assert.equal(await sbx.commands.kill(7), false);
  assert.equal((await sbx.commands.getInfo(42)).id, 'p1');
  await assert.rejects(sbx.commands.kill(1.5), InvalidArgumentError);
});

test('files: streamed write with mode, read formats, errors, makeDir, watch', async () => {
  const sbx = await Sandbox.connect('sb1', opts());
  const e = await sbx.files.write('/tmp/f.txt', Readable.from([Buffer.from('ab'), Buffer.from('cd')]), { mode: 0o600 });
  assert.equal(e.path, '/tmp/f.txt');
  const put = seen.findLast((s) => s[0] === 'PUT');
  assert.equal(put[1], '/v1/sandboxes/sb1/files?path=%2Ftmp%2Ff.txt&mode=600');
  assert.equal(put[3], 'abcd');
  assert.equal(put[2]['transfer-encoding'], 'chunked');
  await sbx.files.write('/tmp/g.txt', 'xyz');
  assert.equal(seen.findLast((s) => s[0] === 'PUT')[2]['content-length'], '3');
  assert.equal(await sbx.files.read('/x'), 'contents');
  assert.deepEqual(Buffer.from(await sbx.files.read('/x', { format: 'bytes' })).toString(), 'contents');
  const st = await sbx.files.read('/x', { format: 'stream' });
  const parts = [];
  for await (const c of st) parts.push(c);
  assert.equal(Buffer.concat(parts).toString(), 'contents');
  await assert.rejects(sbx.files.read('/nope'), (err) => err instanceof NotFoundError && err.code === 'not_found');
  assert.equal(await sbx.files.exists('/nope'), false);
  assert.equal(await sbx.files.exists('/d'), true);
  assert.equal(await sbx.files.makeDir('/d'), false);
  assert.equal(await sbx.files.makeDir('/n/m'), true);
  assert.match(seen.findLast((s) => s[1].includes('/mkdir'))[1], /path=%2Fn%2Fm&parents=1&mode=755/);
  const events = [];
  let exited = 'no';
  const w = await sbx.files.watchDir('/w', (ev) => events.push(ev), { recursive: true, onExit: (err) => (exited = err) });
  assert.match(seen.findLast((s) => s[1].includes('/watch'))[1], /recursive=1/);
  for (let i = 0; i < 50 && events.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
  await w.stop();
  assert.deepEqual(events.map((e) => [e.type, e.name, e.path]), [['create', 'a/b.txt', '/w/a/b.txt']]);
  assert.equal(exited, undefined);
});

test('timeouts, fork errors, kill', async () => {
  const sbx = await Sandbox.connect('sb1', { ...opts(), requestTimeoutMs: 100 });
  await assert.rejects(sbx.pause({ timeoutMs: 150 }), TimeoutError);
  await assert.rejects(sbx.fork(2), (e) => e.name === 'ForkError' && e.children.length === 1 && e.children[0].sandboxId === 'c1' && e.errors[0] === 'c2: no memory');
  assert.equal(await sbx.kill(), true);
  assert.equal(await Sandbox.kill('zz', opts()), false);
  assert.ok(ConflictError);
});
