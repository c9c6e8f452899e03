// Unit tests that need no daemon: address parsing, request building,
// NDJSON and base64 decoding, error mapping, record conversion.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import {
  ConnectionConfig,
  parseHost,
  query,
  DEFAULT_SOCKET,
  readLines,
  readNDJSON,
  decodeBase64,
  errorFromResponse,
  WarrenError,
  NotFoundError,
  AuthenticationError,
  PermissionDeniedError,
  InvalidArgumentError,
  ConflictError,
  ServerError,
  TimeoutError,
  RateLimitError,
  CommandExitError,
  CommandTimeoutError,
  toArgv,
  toEnvList,
  toEntryInfo,
} from '../dist/index.js';
import { resultOf, toProcessInfo } from '../dist/commands.js';
import { toSandboxInfo } from '../dist/sandbox.js';

function withEnv(vars, fn) {
  const old = {};
  for (const k of Object.keys(vars)) {
    old[k] = process.env[k];
    if (vars[k] === undefined) delete process.env[k];
    else process.env[k] = vars[k];
  }
  try {
    return fn();
  } finally {
    for (const k of Object.keys(old)) {
      if (old[k] === undefined) delete process.env[k];
      else process.env[k] = old[k];
    }
  }
}

const noEnv = { WARREN_HOST: undefined, WARREN_TENANT: undefined, WARREN_TOKEN: undefined, WARREN_CA: undefined };

test('parseHost: unix socket paths, unix://, http(s) URLs', () => {
  assert.deepEqual(parseHost(''), { kind: 'unix', socketPath: DEFAULT_SOCKET });
  assert.deepEqual(parseHost(undefined), { kind: 'unix', socketPath: '/run/warren/hostd.sock' });
  assert.deepEqual(parseHost('/tmp/x.sock'), { kind: 'unix', socketPath: '/tmp/x.sock' });
  assert.deepEqual(parseHost('unix:///tmp/x.sock'), { kind: 'unix', socketPath: '/tmp/x.sock' });
  assert.deepEqual(parseHost('rel/x.sock'), { kind: 'unix', socketPath: 'rel/x.sock' });
  assert.deepEqual(parseHost('http://10.0.0.1:7070'), { kind: 'http', hostname: '10.0.0.1', port: 7070, basePath: '' });
  assert.deepEqual(parseHost('https://warren.example/'), { kind: 'https', hostname: 'warren.example', port: 443, basePath: '' });
  assert.deepEqual(parseHost('http://[::1]:80/api/'), { kind: 'http', hostname: '::1', port: 80, basePath: '/api' });
  assert.throws(() => parseHost('ftp://x'), WarrenError);
  assert.throws(() => parseHost('http://'), WarrenError);
});

test('ConnectionConfig: environment defaults and headers, as the CLI', () => {
  withEnv(noEnv, () => {
    const c = new ConnectionConfig();
    assert.equal(c.host, DEFAULT_SOCKET);
    assert.equal(c.tenant, 'default'); // unix socket: "default"
    assert.deepEqual(c.headers(), { 'X-Warren-Tenant': 'default' });
  });
  withEnv({ ...noEnv, WARREN_HOST: 'unix:///tmp/h.sock', WARREN_TENANT: 'acme' }, () => {
    const c = new ConnectionConfig();
    assert.deepEqual(c.endpoint, { kind: 'unix', socketPath: '/tmp/h.sock' });
    assert.equal(c.tenant, 'acme');
    const b = c.build('GET', '/v1/sandboxes?x=1');
    assert.equal(b.options.socketPath, '/tmp/h.sock');
    assert.equal(b.options.path, '/v1/sandboxes?x=1');
    assert.equal(b.options.headers['X-Warren-Tenant'], 'acme');
    assert.equal(b.options.headers.Authorization, undefined);
    assert.equal(b.https, false);
  });
  withEnv({ ...noEnv, WARREN_HOST: 'http://h:9/base', WARREN_TOKEN: 's3cret' }, () => {
    const c = new ConnectionConfig();
    assert.equal(c.tenant, ''); // TCP: the token's tenant, no header
    const b = c.build('POST', '/v1/sandboxes', { 'Content-Type': 'application/json' });
    assert.equal(b.options.hostname, 'h');
    assert.equal(b.options.port, 9);
    assert.equal(b.options.path, '/base/v1/sandboxes');
    assert.equal(b.options.headers.Authorization, 'Bearer s3cret');
    assert.equal(b.options.headers['X-Warren-Tenant'], undefined);
    assert.equal(b.options.headers['Content-Type'], 'application/json');
  });
  withEnv({ ...noEnv, WARREN_HOST: 'http://h:9', WARREN_TENANT: 'env' }, () => {
    // Explicit options win over the environment.
    const c = new ConnectionConfig({ host: '/s.sock', tenant: 't1', token: 'tok' });
    assert.equal(c.host, '/s.sock');
    assert.deepEqual(c.headers(), { 'X-Warren-Tenant': 't1', Authorization: 'Bearer tok' });
    assert.deepEqual(new ConnectionConfig(c.opts).headers(), c.headers());
  });
  withEnv(noEnv, () => {
    assert.throws(() => new ConnectionConfig({ host: '/s.sock', ca: 'PEM' }), /https/);
    const c = new ConnectionConfig({ host: 'https://h', ca: 'PEM' });
    const b = c.build('GET', '/v1/health');
    assert.equal(b.https, true);
    assert.equal(b.options.ca, 'PEM');
    assert.equal(b.options.port, 443);
  });
});

test('query: defined values only, booleans as 1/0', () => {
  assert.equal(query({}), '');
  assert.equal(query({ a: undefined }), '');
  assert.equal(query({ path: '/a b&c', depth: 2, follow: true, x: false }), '?path=%2Fa+b%26c&depth=2&follow=1&x=0');
});

test('readLines: split across chunks, CRLF, blank lines, a cut last line', async () => {
  const src = Readable.from([Buffer.from('{"a":1}\n{"b"'), Buffer.from(':2}\r\n\n'), Buffer.from('{"c":3}')]);
  const lines = [];
  for await (const l of readLines(src)) lines.push(l.toString());
  assert.deepEqual(lines, ['{"a":1}', '{"b":2}', '{"c":3}']);
});

test('readLines: a line over the bound is an error, not a buffer without end', async () => {
  const big = Buffer.alloc(100, 'x');
  await assert.rejects(async () => {
    for await (const _ of readLines(Readable.from([big, big]), 150)) void _;
  }, /longer than 150/);
  await assert.rejects(async () => {
    for await (const _ of readLines(Readable.from([Buffer.concat([big, Buffer.from('\n')])]), 50)) void _;
  }, /longer than 50/);
  // Exactly at the bound is fine.
  const out = [];
  for await (const l of readLines(Readable.from([Buffer.from('12345\n')]), 5)) out.push(l.toString());
  assert.deepEqual(out, ['12345']);
});

test('readNDJSON: JSON values; a cut line is an error', async () => {
  const vals = [];
  for await (const v of readNDJSON(Readable.from(['{"start":{"offset":5}}\n{"stdout":"aGk="}\n{"exit":0}\n']))) vals.push(v);
  assert.deepEqual(vals, [{ start: { offset: 5 } }, { stdout: 'aGk=' }, { exit: 0 }]);
  await assert.rejects(async () => {
    for await (const _ of readNDJSON(Readable.from(['{"exit":0}\n{"stdo']))) void _;
  }, /bad NDJSON line/);
});

test('decodeBase64', () => {
  assert.deepEqual(Buffer.from(decodeBase64('aGVsbG8K')).toString(), 'hello\n');
  assert.equal(decodeBase64('').byteLength, 0);
  assert.equal(decodeBase64(undefined).byteLength, 0);
  assert.deepEqual([...decodeBase64('AP8=')], [0, 255]);
});

test('errorFromResponse: statuses and agent codes to classes', () => {
  const e = errorFromResponse(404, '{"error":"sandbox x not found"}', 'GET /v1/sandboxes/x');
  assert.ok(e instanceof NotFoundError && e instanceof WarrenError && e instanceof Error);
  assert.equal(e.status, 404);
  assert.match(e.message, /GET \/v1\/sandboxes\/x: sandbox x not found \(404\)/);
  assert.equal(e.name, 'NotFoundError');
  assert.ok(errorFromResponse(401, '{"error":"no"}') instanceof AuthenticationError);
  assert.ok(errorFromResponse(403, '{"error":"no"}') instanceof PermissionDeniedError);
  assert.ok(errorFromResponse(400, 'bad') instanceof InvalidArgumentError);
  assert.ok(errorFromResponse(409, '{"error":"paused"}') instanceof ConflictError);
  assert.ok(errorFromResponse(429, '') instanceof RateLimitError);
  assert.ok(errorFromResponse(504, '') instanceof TimeoutError);
  assert.ok(errorFromResponse(502, '{"error":"agent"}') instanceof ServerError);
  assert.ok(errorFromResponse(418, '') instanceof WarrenError);
  // Agent codes win for 4xx.
  const nf = errorFromResponse(400, '{"error":"no such file","code":"not_found"}');
  assert.ok(nf instanceof NotFoundError);
  assert.equal(nf.code, 'not_found');
  assert.ok(errorFromResponse(400, '{"error":"x","code":"exists"}') instanceof ConflictError);
  assert.ok(errorFromResponse(400, '{"error":"x","code":"is_directory"}') instanceof InvalidArgumentError);
  assert.ok(errorFromResponse(400, '{"error":"x","code":"permission_denied"}') instanceof PermissionDeniedError);
  // Plain text, or nothing.
  assert.match(errorFromResponse(500, 'boom\n').message, /^boom \(500\)$/);
  assert.match(errorFromResponse(500, '').message, /HTTP 500/);
});

test('resultOf: CommandExitError on non-zero exit, CommandTimeoutError on timeout', () => {
  assert.deepEqual(resultOf({ code: 0 }, 'out', ''), { stdout: 'out', stderr: '', exitCode: 0 });
  try {
    resultOf({ code: 3 }, 'o', 'bad thing\n');
    assert.fail('no error');
  } catch (e) {
    assert.ok(e instanceof CommandExitError && e instanceof WarrenError);
    assert.equal(e.exitCode, 3);
    assert.equal(e.stdout, 'o');
    assert.equal(e.stderr, 'bad thing\n');
    assert.match(e.message, /exited with code 3: bad thing/);
  }
  try {
    resultOf({ code: 137, signal: 'SIGKILL' }, '', '');
    assert.fail('no error');
  } catch (e) {
    assert.equal(e.error, 'killed by SIGKILL');
    assert.equal(e.result.signal, 'SIGKILL');
  }
  try {
    resultOf({ code: 137, signal: 'SIGKILL', timedOut: true }, 'partial', '');
    assert.fail('no error');
  } catch (e) {
    assert.ok(e instanceof CommandTimeoutError && e instanceof TimeoutError);
    assert.equal(e.result.stdout, 'partial');
    assert.equal(e.result.error, 'timed out');
  }
});

test('toArgv and toEnvList', () => {
  assert.deepEqual(toArgv('echo hi'), ['/bin/sh', '-c', 'echo hi']);
  assert.deepEqual(toArgv(['ls', '-l']), ['ls', '-l']);
  assert.throws(() => toArgv([]), InvalidArgumentError);
  assert.equal(toEnvList(undefined), undefined);
  assert.equal(toEnvList({}), undefined);
  assert.deepEqual(toEnvList({ A: '1', B: 'x=y' }), ['A=1', 'B=x=y']);
  assert.throws(() => toEnvList({ 'A=B': '1' }), InvalidArgumentError);
});

test('toEntryInfo: Go fs.FileMode to type and permissions', () => {
  const dir = toEntryInfo({ name: 'd', size: 4096, mode: 2147484141, mod_time: '2026-12-04T10:00:00.5Z', is_dir: true, path: '/tmp/d' });
  assert.equal(dir.type, 'dir');
  assert.equal(dir.mode, 0o755);
  assert.equal(dir.permissions, 'rwxr-xr-x');
  assert.equal(dir.path, '/tmp/d');
  assert.equal(dir.modifiedTime.toISOString(), '2026-12-04T10:00:00.500Z');
  const f = toEntryInfo({ name: 'f', size: 3, mode: 0o644, mod_time: '2026-12-04T10:00:00Z', is_dir: false }, '/tmp/f');
  assert.equal(f.type, 'file');
  assert.equal(f.path, '/tmp/f');
  assert.equal(f.permissions, 'rw-r--r--');
  const l = toEntryInfo({ name: 'l', size: 1, mode: 2 ** 27 + 0o777, mod_time: '2026-12-04T10:00:00Z', is_dir: false, link: '/etc' }, '/l');
  assert.equal(l.type, 'symlink');
  assert.equal(l.symlinkTarget, '/etc');
  // setuid (1<<23) with 0755: 04755.
  assert.equal(toEntryInfo({ name: 's', size: 0, mode: 2 ** 23 + 0o755, mod_time: '2026-12-04T10:00:00Z', is_dir: false }).mode, 0o4755);
  // /tmp: dir + sticky (1<<20) + 0777.
  const t = toEntryInfo({ name: 'tmp', size: 0, mode: 2 ** 31 + 2 ** 20 + 0o777, mod_time: '2026-12-04T10:00:00Z', is_dir: true });
  assert.equal(t.mode, 0o1777);
  assert.equal(t.type, 'dir');
});

test('toProcessInfo and toSandboxInfo', () => {
  const p = toProcessInfo({
    id: 'p3',
    pid: 812,
    argv: ['/bin/sh', '-c', 'sleep 3'],
    state: 'exited',
    started_at: '2026-12-04T10:00:00Z',
    exit: { code: 0 },
    output_bytes: 5,
    output_from: 0,
    pty: { rows: 24, cols: 80 },
  });
  // As the Python SDK's ProcessInfo: id is the process's id in the sandbox, pid the guest's.
  assert.equal(p.id, 'p3');
  assert.equal(p.pid, 812);
  assert.equal('guestPid' in p, false);
  assert.deepEqual(p.argv, ['/bin/sh', '-c', 'sleep 3']);
  assert.equal(p.cmd, '/bin/sh');
  assert.deepEqual(p.args, ['-c', 'sleep 3']);
  assert.equal(p.exitCode, 0);
  assert.deepEqual(p.pty, { rows: 24, cols: 80 });
  assert.equal(p.stdinOpen, false);
  const s = toSandboxInfo({
    id: 'sb1',
    tenant: 't',
    template: 'tpl',
    status: 'running',
    mem_mib: 512,
    cpus: 1,
    env: ['A=1', 'B=x=y'],
    labels: { name: 'web' },
    created: '2026-12-04T10:00:00Z',
    updated: '2026-12-04T10:00:01Z',
    snapshots: [{ name: 's1', kind: 'full', time: '2026-12-04T10:00:02Z', layer_bytes: 10, pause_ms: 1.5 }],
  });
  assert.equal(s.sandboxId, 'sb1');
  assert.equal(s.templateId, 'tpl');
  assert.deepEqual(s.envs, { A: '1', B: 'x=y' });
  assert.equal(s.metadata, s.labels);
  assert.equal(s.snapshots[0].pauseMs, 1.5);
  assert.equal(s.snapshots[0].layerBytes, 10);
});
