/**
 * Commands in a sandbox, on the daemon's process API
 * (`/v1/sandboxes/{id}/processes`): a process outlives the connection that
 * started it, its output is kept (the last MiB) and read from any offset, so
 * a handle whose stream broke (a daemon restart, a pause, a rollback) comes
 * back from the offset it reached, and a new client comes back to a running
 * command with {@link Commands.connect}.
 *
 * @module
 */
import { Buffer } from 'node:buffer';
import { ConnectionConfig, query, sandboxPath } from './connection.js';
import {
  CommandExitError,
  CommandResult,
  CommandTimeoutError,
  ConflictError,
  InvalidArgumentError,
  AuthenticationError,
  NotFoundError,
  PermissionDeniedError,
  StreamError,
  WarrenError,
} from './errors.js';
import { OutputFrame, decodeBase64, readNDJSON } from './ndjson.js';

/** The default bound on a command's run: 0, none (E2B's is 60 s; the Python SDK has none either). */
export const DEFAULT_COMMAND_TIMEOUT_MS = 0;

/** How long a handle keeps reconnecting a broken output stream without any progress before it gives up: 5 minutes. */
export const RECONNECT_WINDOW_MS = 5 * 60_000;

/** A process's state as the daemon reports it (wire.ProcessInfo). */
export interface RawProcessInfo {
  id: string;
  pid: number;
  argv: string[];
  cwd?: string;
  user?: string;
  tag?: string;
  pty?: { rows: number; cols: number };
  state: 'running' | 'exited';
  started_at: string;
  exit?: { code: number; signal?: string; timed_out?: boolean };
  output_bytes: number;
  output_from: number;
  stdin_open?: boolean;
}

/**
 * How every process call ({@link Commands.connect}, `kill`, `sendStdin`, ...)
 * takes a process: its id in the sandbox (a string: {@link CommandHandle.id},
 * {@link ProcessInfo.id}), or its pid in the guest (a number:
 * {@link CommandHandle.pid}, {@link ProcessInfo.pid}), looked up among the
 * sandbox's processes. As the Python SDK's `ProcessRef`.
 */
export type ProcessRef = string | number;

/**
 * A command (process) of a sandbox, running or exited: {@link Commands.list}'s
 * entries (the Python SDK's `ProcessInfo`).
 */
export interface ProcessInfo {
  /** The process's id in its sandbox, assigned by the daemon (e.g. "1b5103a2-3"): what {@link Commands.connect}, `kill` and `sendStdin` take. */
  id: string;
  /** Its pid in the guest (also its process group's), as E2B's `pid`; the process calls take it too. */
  pid: number;
  /** Its command line. */
  argv: string[];
  /** The program (argv[0]). */
  cmd: string;
  /** Its arguments (argv[1:]). */
  args: string[];
  /** Its working directory, if one was given. */
  cwd?: string;
  /** The user it runs as, if one was given. */
  user?: string;
  /** The tag it was started with, if any. */
  tag?: string;
  /** Its terminal's size, if it runs on a PTY. */
  pty?: { rows: number; cols: number };
  /** "running" or "exited". */
  state: 'running' | 'exited';
  /** When it started (guest clock). */
  startedAt: Date;
  /** Its exit code, once exited (128+n when signal n killed it). */
  exitCode?: number;
  /** The signal that killed it, if one did. */
  signal?: string;
  /** Its timeout killed it. */
  timedOut?: boolean;
  /** How many bytes of output it wrote in all (stdout and stderr together). */
  outputBytes: number;
  /** The offset of the oldest output byte still kept. */
  outputFrom: number;
  /** Its standard input is still open for `sendStdin`. */
  stdinOpen: boolean;
}

/**
 * Converts the daemon's process record to the SDK's.
 *
 * @param r - the daemon's record
 */
export function toProcessInfo(r: RawProcessInfo): ProcessInfo {
  const p: ProcessInfo = {
    id: r.id,
    pid: r.pid,
    argv: r.argv ? [...r.argv] : [],
    cmd: r.argv?.[0] ?? '',
    args: r.argv?.slice(1) ?? [],
    state: r.state,
    startedAt: new Date(r.started_at),
    outputBytes: r.output_bytes ?? 0,
    outputFrom: r.output_from ?? 0,
    stdinOpen: !!r.stdin_open,
  };
  if (r.cwd) p.cwd = r.cwd;
  if (r.user) p.user = r.user;
  if (r.tag) p.tag = r.tag;
  if (r.pty) p.pty = { rows: r.pty.rows, cols: r.pty.cols };
  if (r.exit) {
    p.exitCode = r.exit.code;
    if (r.exit.signal) p.signal = r.exit.signal;
    if (r.exit.timed_out) p.timedOut = true;
  }
  return p;
}

/** How a process ended, as its output stream's last frame or `/wait` says. */
export interface ExitInfo {
  /** The exit code (128+n for signal n). */
  code: number;
  /** The signal that killed it, if one did. */
  signal?: string;
  /** Its timeout killed it. */
  timedOut?: boolean;
}

/** One chunk of a command's output, as {@link CommandHandle}'s async iteration yields it. */
export interface OutputChunk {
  /** Which stream it came on (a PTY's output is all "stdout"). */
  stream: 'stdout' | 'stderr';
  /** The text (UTF-8, decoded across chunk boundaries). */
  data: string;
}

/** Options of {@link Commands.run}. */
export interface CommandStartOpts {
  /** Return a {@link CommandHandle} at once instead of waiting for the exit. */
  background?: boolean;
  /** Called with each piece of standard output as it comes (decoded as UTF-8). */
  onStdout?: (data: string) => void | Promise<void>;
  /** Called with each piece of standard error as it comes. */
  onStderr?: (data: string) => void | Promise<void>;
  /** The working directory. */
  cwd?: string;
  /** Environment variables, added after the sandbox's own. */
  envs?: Record<string, string>;
  /** The user to run as (default the agent's: root). */
  user?: string;
  /** Kill the command after this many ms (default 0: never; E2B's default is 60 000). */
  timeoutMs?: number;
  /**
   * Standard input: `true` keeps it open for {@link CommandHandle.sendStdin}
   * (close it with `closeStdin`); a string or bytes is the whole input,
   * sent and closed at once. Absent: /dev/null.
   */
  stdin?: boolean | string | Uint8Array;
  /** A free-form label reported back by {@link Commands.list} (at most 256 bytes). */
  tag?: string;
}

/** Options of {@link Commands.connect}. */
export interface CommandConnectOpts {
  /** Called with each piece of standard output as it comes. */
  onStdout?: (data: string) => void | Promise<void>;
  /** Called with each piece of standard error as it comes. */
  onStderr?: (data: string) => void | Promise<void>;
  /**
   * Replay the output from the oldest byte the guest keeps (its last MiB;
   * the default, as the Python SDK's `replay`), or with `false` only what
   * comes from now on (E2B's behaviour).
   */
  fromStart?: boolean;
}

/** Turns a command given as a string (run with /bin/sh -c) or argv into argv. */
export function toArgv(cmd: string | string[]): string[] {
  if (Array.isArray(cmd)) {
    if (cmd.length === 0) throw new InvalidArgumentError('an empty command');
    return [...cmd];
  }
  return ['/bin/sh', '-c', cmd];
}

/** Turns E2B-style envs ({K: V}) into the daemon's ["K=V"]. */
export function toEnvList(envs: Record<string, string> | undefined): string[] | undefined {
  if (!envs) return undefined;
  const l = Object.entries(envs).map(([k, v]) => {
    if (!k || k.includes('=')) throw new InvalidArgumentError(`bad environment variable name ${JSON.stringify(k)}`);
    return `${k}=${v}`;
  });
  return l.length ? l : undefined;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** The errors a reconnect cannot cure: the process, the sandbox or the credentials are gone. */
function isFinal(e: unknown): boolean {
  return e instanceof NotFoundError || e instanceof AuthenticationError || e instanceof PermissionDeniedError || e instanceof InvalidArgumentError;
}

/**
 * Follows a process's output stream, reconnecting from the offset reached
 * when it breaks, until the exit frame (`done` resolves to it) or `stop()`.
 * Internal.
 */
export class OutputFollower {
  /** Resolves with the process's exit; rejects when the stream cannot be resumed (or was stopped). */
  readonly done: Promise<ExitInfo>;
  /** The offset of the next byte (start.offset + the bytes received). */
  offset: number | undefined;
  /** Bytes asked for that were no longer kept. */
  dropped = 0;
  private ac: AbortController | undefined;
  private stopped = false;

  constructor(
    private readonly conn: ConnectionConfig,
    private readonly sandboxId: string,
    private readonly id: string,
    offset: number | undefined,
    private readonly onData: (stream: 'stdout' | 'stderr', data: Uint8Array) => void,
  ) {
    this.offset = offset;
    this.done = this.loop();
    this.done.catch(() => {}); // a rejection nobody awaits is not an unhandled one
  }

  /** Stops following (the process keeps running); `done` rejects. */
  stop(): void {
    this.stopped = true;
    this.ac?.abort(new StreamError('disconnected'));
  }

  /** Whether `stop` was called. */
  get isStopped(): boolean {
    return this.stopped;
  }

  private async loop(): Promise<ExitInfo> {
    let lastProgress = Date.now();
    let delay = 100;
    let lastErr: unknown;
    while (!this.stopped) {
      const ac = new AbortController();
      this.ac = ac;
      try {
        const path = sandboxPath(this.sandboxId, `/processes/${encodeURIComponent(this.id)}/output`) + query({ offset: this.offset, follow: 1 });
        const res = await this.conn.request('GET', path, { headers: { Accept: 'application/x-ndjson' }, signal: ac.signal });
        for await (const f of readNDJSON<OutputFrame>(res)) {
          if (f.start) {
            this.offset = f.start.offset;
            this.dropped += f.start.dropped ?? 0;
          } else if (f.stdout !== undefined || f.stderr !== undefined) {
            const stream = f.stdout !== undefined ? 'stdout' : 'stderr';
            const b = decodeBase64(stream === 'stdout' ? f.stdout : f.stderr);
            this.offset = (this.offset ?? 0) + b.byteLength;
            lastProgress = Date.now();
            delay = 100;
            if (b.byteLength) this.onData(stream, b);
          } else if (f.exit !== undefined) {
            res.destroy();
            const x: ExitInfo = { code: f.exit };
            if (f.signal) x.signal = f.signal;
            if (f.timed_out) x.timedOut = true;
            return x;
          } else if (f.error !== undefined) {
            throw new StreamError(`output of ${this.id}: ${f.error}`, 502);
          }
        }
        throw new StreamError(`output of ${this.id}: the stream ended before the exit`);
      } catch (e) {
        if (this.stopped) break;
        if (isFinal(e)) throw e;
        lastErr = e;
        if (Date.now() - lastProgress > RECONNECT_WINDOW_MS) {
          throw e instanceof StreamError ? e : new StreamError(`output of ${this.id}: cannot resume: ${(e as Error).message}`);
        }
        await sleep(delay);
        delay = Math.min(delay * 2, 2000);
      }
    }
    throw lastErr instanceof Error && !this.stopped ? lastErr : new StreamError(`output of ${this.id}: disconnected`);
  }
}

/** What a handle needs to start following. Internal. */
export interface HandleInit {
  conn: ConnectionConfig;
  sandboxId: string;
  info: RawProcessInfo;
  /** Where to start reading the output (undefined: the oldest byte kept). */
  offset: number | undefined;
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
  /** Raw bytes of a PTY's output. */
  onData?: (data: Uint8Array) => void | Promise<void>;
}

/**
 * A running (or exited) command: its output as it comes (callbacks,
 * `stdout`/`stderr`, async iteration), its stdin, and its end. Returned by
 * a background {@link Commands.run}, by {@link Commands.connect} and (for a
 * terminal) by `pty.create`. The process does not depend on the handle:
 * {@link CommandHandle.disconnect} leaves it running.
 */
export class CommandHandle implements AsyncIterable<OutputChunk> {
  /**
   * The process's id in its sandbox, assigned by the daemon (e.g.
   * "1b5103a2-3"): the key to come back to it ({@link Commands.connect}),
   * kill it or write to it from any client. As the Python SDK's `handle.id`.
   */
  readonly id: string;
  /**
   * Its pid in the guest (also its process group's), as E2B's and the
   * Python SDK's `handle.pid`. The process calls take it too (looked up
   * among the sandbox's processes), but {@link CommandHandle.id} is the
   * stable key.
   */
  readonly pid: number;
  /** The sandbox it runs in. */
  readonly sandboxId: string;
  /** @internal */
  protected readonly conn: ConnectionConfig;
  private readonly follower: OutputFollower;
  private readonly chunks: OutputChunk[] = [];
  private readonly decoders = { stdout: new TextDecoder('utf-8'), stderr: new TextDecoder('utf-8') };
  private waiters: (() => void)[] = [];
  private exit: ExitInfo | undefined;
  private ended = false;
  private endError: unknown;
  private callbackError: unknown;

  /** @internal Use `commands.run`, `commands.connect` or `pty.create`. */
  constructor(init: HandleInit) {
    this.conn = init.conn;
    this.sandboxId = init.sandboxId;
    this.id = init.info.id;
    this.pid = init.info.pid;
    const push = (stream: 'stdout' | 'stderr', text: string) => {
      if (!text) return;
      this.chunks.push({ stream, data: text });
      const cb = stream === 'stdout' ? init.onStdout : init.onStderr;
      if (cb) this.guard(() => cb(text));
      this.wake();
    };
    this.follower = new OutputFollower(init.conn, init.sandboxId, this.id, init.offset, (stream, bytes) => {
      if (init.onData) {
        const cb = init.onData;
        this.guard(() => cb(bytes));
      }
      push(stream, this.decoders[stream].decode(bytes, { stream: true }));
    });
    this.follower.done.then(
      (x) => {
        this.exit = x;
        for (const s of ['stdout', 'stderr'] as const) push(s, this.decoders[s].decode());
        this.finish();
      },
      (e) => {
        this.endError = e;
        this.finish();
      },
    );
  }

  private guard(f: () => void | Promise<void>): void {
    try {
      const r = f();
      if (r && typeof (r as Promise<void>).catch === 'function') (r as Promise<void>).catch((e) => (this.callbackError ??= e));
    } catch (e) {
      this.callbackError ??= e;
    }
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  private finish(): void {
    this.ended = true;
    this.wake();
  }

  /** Everything the command wrote to its standard output so far (a PTY's output). */
  get stdout(): string {
    return this.chunks.filter((c) => c.stream === 'stdout').map((c) => c.data).join('');
  }

  /** Everything it wrote to its standard error so far. */
  get stderr(): string {
    return this.chunks.filter((c) => c.stream === 'stderr').map((c) => c.data).join('');
  }

  /** Its exit code once it has exited and the handle has seen it (undefined before). */
  get exitCode(): number | undefined {
    return this.exit?.code;
  }

  /** Why it ended abnormally ("killed by SIGKILL", "timed out"), once it has. */
  get error(): string | undefined {
    return this.exit ? exitError(this.exit) : undefined;
  }

  /** How many bytes asked for had been dropped by the guest before they could be read (output past the last MiB kept). */
  get droppedBytes(): number {
    return this.follower.dropped;
  }

  /**
   * Waits for the command to exit and returns its result.
   *
   * @throws CommandExitError when it exited with a non-zero code (E2B's behaviour)
   * @throws CommandTimeoutError (a TimeoutError) when its timeout killed it
   * @throws StreamError when its output stream could not be resumed (the process or sandbox is gone)
   */
  async wait(): Promise<CommandResult> {
    let x: ExitInfo;
    if (this.follower.isStopped && !this.exit) {
      // Disconnected: ask the daemon for the exit only.
      const info = await this.conn.json<RawProcessInfo>('GET', sandboxPath(this.sandboxId, `/processes/${encodeURIComponent(this.id)}/wait`), undefined, { timeoutMs: 0 });
      x = info.exit ?? { code: -1 };
    } else {
      x = await this.follower.done;
    }
    if (this.callbackError) throw this.callbackError;
    return resultOf(x, this.stdout, this.stderr, this.follower.dropped);
  }

  /**
   * Kills the command (SIGKILL to its process group).
   *
   * @returns true if it was killed, false if it was not found or had already exited
   */
  async kill(): Promise<boolean> {
    return killProcess(this.conn, this.sandboxId, this.id);
  }

  /**
   * Sends a signal to the command's process group.
   *
   * @param signal - a name ("SIGTERM", "TERM") or a number ("15")
   */
  async signal(signal: string): Promise<ProcessInfo> {
    return signalProcess(this.conn, this.sandboxId, this.id, signal);
  }

  /**
   * Writes to the command's standard input (it must have been started with `stdin: true`).
   *
   * @param data - text (UTF-8) or bytes
   */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    await sendStdin(this.conn, this.sandboxId, this.id, data, false);
  }

  /** Closes the command's standard input (end of file). */
  async closeStdin(): Promise<void> {
    await sendStdin(this.conn, this.sandboxId, this.id, '', true);
  }

  /**
   * Stops receiving the command's output; the command keeps running, and
   * {@link Commands.connect} comes back to it. A later `wait()` asks the
   * daemon for its exit only.
   */
  async disconnect(): Promise<void> {
    this.follower.stop();
  }

  /**
   * The command's output, chunk by chunk, from its first chunk this handle
   * received until its exit (then the iteration ends; an output stream
   * that cannot be resumed throws). Several iterations may run at once.
   */
  async *[Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    let i = 0;
    for (;;) {
      while (i < this.chunks.length) yield this.chunks[i++]!;
      if (this.ended) {
        if (this.endError && !this.follower.isStopped) throw this.endError;
        return;
      }
      await new Promise<void>((r) => this.waiters.push(r));
    }
  }
}

/** The message of an abnormal end ("killed by SIGKILL", "timed out"), if any. */
function exitError(x: ExitInfo): string | undefined {
  if (x.timedOut) return 'timed out';
  if (x.signal) return `killed by ${x.signal}`;
  return undefined;
}

/**
 * A command's result from its exit and output; throws what a foreground run
 * throws (TimeoutError for a timeout, CommandExitError for a non-zero exit).
 *
 * @param x - how it ended
 * @param stdout - its standard output
 * @param stderr - its standard error
 * @param dropped - output bytes no longer kept when read
 */
export function resultOf(x: ExitInfo, stdout: string, stderr: string, dropped = 0): CommandResult {
  const r: CommandResult = { stdout, stderr, exitCode: x.code };
  const err = exitError(x);
  if (err) r.error = err;
  if (x.signal) r.signal = x.signal;
  if (x.timedOut) r.timedOut = true;
  if (dropped) r.dropped = dropped;
  if (x.timedOut) throw new CommandTimeoutError(r);
  if (x.code !== 0) throw new CommandExitError(r);
  return r;
}

function procPath(sandboxId: string, id: string, rest = ''): string {
  return sandboxPath(sandboxId, `/processes/${encodeURIComponent(id)}${rest}`);
}

async function killProcess(conn: ConnectionConfig, sandboxId: string, id: string): Promise<boolean> {
  try {
    const info = await conn.json<RawProcessInfo>('POST', procPath(sandboxId, id, '/signal'), { signal: 'SIGKILL' });
    return !(info && info.state === 'exited' && info.exit && !info.exit.signal);
  } catch (e) {
    if (e instanceof NotFoundError || e instanceof ConflictError) return false;
    throw e;
  }
}

async function signalProcess(conn: ConnectionConfig, sandboxId: string, id: string, signal: string): Promise<ProcessInfo> {
  return toProcessInfo(await conn.json<RawProcessInfo>('POST', procPath(sandboxId, id, '/signal'), { signal }));
}

async function sendStdin(conn: ConnectionConfig, sandboxId: string, id: string, data: string | Uint8Array, eof: boolean): Promise<void> {
  const b = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
  // The daemon takes at most 1 MiB a request.
  const max = 1 << 20;
  for (let off = 0; off < b.byteLength || (off === 0 && eof); off += max) {
    const part = b.subarray(off, off + max);
    const last = off + max >= b.byteLength;
    const res = await conn.request('POST', procPath(sandboxId, id, '/stdin') + (eof && last ? '?eof=1' : ''), { body: part });
    res.resume();
    if (last) break;
  }
}

/**
 * The commands of one sandbox: `sandbox.commands`.
 */
export class Commands {
  /** @internal Use `sandbox.commands`. */
  constructor(
    private readonly conn: ConnectionConfig,
    private readonly sandboxId: string,
  ) {}

  /**
   * Starts a command and returns a handle at once (`background: true`).
   *
   * @param cmd - a shell command line (run with /bin/sh -c) or an argv
   * @param opts - callbacks, cwd, envs, user, timeout, stdin
   */
  run(cmd: string | string[], opts: CommandStartOpts & { background: true }): Promise<CommandHandle>;
  /**
   * Runs a command and waits for its exit.
   *
   * @param cmd - a shell command line (run with /bin/sh -c) or an argv
   * @param opts - callbacks, cwd, envs, user, timeout, stdin
   * @returns its result
   * @throws CommandExitError on a non-zero exit (E2B's behaviour), TimeoutError when its timeout killed it
   */
  run(cmd: string | string[], opts?: CommandStartOpts & { background?: false }): Promise<CommandResult>;
  /** Runs a command, in the foreground or the background per `opts.background`. */
  run(cmd: string | string[], opts?: CommandStartOpts): Promise<CommandHandle | CommandResult>;
  async run(cmd: string | string[], opts: CommandStartOpts = {}): Promise<CommandHandle | CommandResult> {
    const data = typeof opts.stdin === 'string' || opts.stdin instanceof Uint8Array ? opts.stdin : undefined;
    const info = await this.start(cmd, opts, data !== undefined || opts.stdin === true);
    if (data !== undefined) await sendStdin(this.conn, this.sandboxId, info.id, data, true);
    const h = new CommandHandle({ conn: this.conn, sandboxId: this.sandboxId, info, offset: 0, onStdout: opts.onStdout, onStderr: opts.onStderr });
    if (opts.background) return h;
    return h.wait();
  }

  /** Starts a process; returns the daemon's record. Internal. */
  async start(
    cmd: string | string[],
    opts: { cwd?: string; envs?: Record<string, string>; user?: string; timeoutMs?: number; tag?: string },
    stdin: boolean,
    pty?: { rows: number; cols: number },
  ): Promise<RawProcessInfo> {
    const timeout = opts.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    const req: Record<string, unknown> = { argv: toArgv(cmd) };
    const env = toEnvList(opts.envs);
    if (env) req.env = env;
    if (opts.cwd) req.cwd = opts.cwd;
    if (opts.user) req.user = opts.user;
    if (timeout > 0) req.timeout_ms = Math.ceil(timeout);
    if (pty) req.pty = pty;
    if (stdin) req.stdin = true;
    if (opts.tag) req.tag = opts.tag;
    return this.conn.json<RawProcessInfo>('POST', sandboxPath(this.sandboxId, '/processes'), req);
  }

  /**
   * The process id of `pid`: an id (a string) as is, or a guest pid (an
   * integer) looked up among the sandbox's processes (the running one
   * when an exited one had the same pid). Internal.
   *
   * @throws InvalidArgumentError when `pid` is neither
   * @throws NotFoundError when no single process has that guest pid
   */
  async resolve(pid: ProcessRef): Promise<string> {
    if (typeof pid === 'string') return pid;
    if (typeof pid !== 'number' || !Number.isInteger(pid)) {
      throw new InvalidArgumentError(`a process is its id (a string) or its guest pid (an integer), not ${String(pid)}`);
    }
    const l = await this.list();
    const m = l.filter((p) => p.pid === pid);
    const running = m.filter((p) => p.state === 'running');
    const one = running.length === 1 ? running[0] : m.length === 1 ? m[0] : undefined;
    if (!one) throw new NotFoundError(`no single process with guest pid ${pid} in sandbox ${this.sandboxId}`, 404);
    return one.id;
  }

  /** The sandbox's commands, running and exited (the guest keeps the latest 256), oldest first. */
  async list(): Promise<ProcessInfo[]> {
    const l = await this.conn.json<RawProcessInfo[]>('GET', sandboxPath(this.sandboxId, '/processes'));
    return (l ?? []).map(toProcessInfo);
  }

  /**
   * One command's state.
   *
   * @param pid - the process's id (`handle.id`, `ProcessInfo.id`), or its guest pid (a number: `handle.pid`), looked up
   * @throws NotFoundError when the sandbox does not know it
   */
  async getInfo(pid: ProcessRef): Promise<ProcessInfo> {
    return toProcessInfo(await this.conn.json<RawProcessInfo>('GET', procPath(this.sandboxId, await this.resolve(pid))));
  }

  /**
   * Comes back to a command, from this or any other client: a handle that
   * follows its output (by default from the oldest byte kept, with
   * `fromStart: false` from now on) until its exit.
   *
   * @param pid - the process's id (`handle.id`, `ProcessInfo.id`), or its guest pid (a number: `handle.pid`), looked up
   * @param opts - callbacks, fromStart
   * @throws NotFoundError when the sandbox does not know it
   */
  async connect(pid: ProcessRef, opts: CommandConnectOpts = {}): Promise<CommandHandle> {
    const info = await this.conn.json<RawProcessInfo>('GET', procPath(this.sandboxId, await this.resolve(pid)));
    return new CommandHandle({
      conn: this.conn,
      sandboxId: this.sandboxId,
      info,
      offset: opts.fromStart === false ? info.output_bytes : undefined,
      onStdout: opts.onStdout,
      onStderr: opts.onStderr,
    });
  }

  /**
   * Kills a command (SIGKILL to its process group).
   *
   * @param pid - the process's id (`handle.id`, `ProcessInfo.id`), or its guest pid (a number: `handle.pid`), looked up
   * @returns true if it was killed, false if it was not found or had already exited
   */
  async kill(pid: ProcessRef): Promise<boolean> {
    let id: string;
    try {
      id = await this.resolve(pid);
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
    return killProcess(this.conn, this.sandboxId, id);
  }

  /**
   * Sends a signal to a command's process group.
   *
   * @param pid - the process's id (`handle.id`, `ProcessInfo.id`), or its guest pid (a number: `handle.pid`), looked up
   * @param signal - a name ("SIGTERM", "TERM") or a number ("15")
   */
  async signal(pid: ProcessRef, signal: string): Promise<ProcessInfo> {
    return signalProcess(this.conn, this.sandboxId, await this.resolve(pid), signal);
  }

  /**
   * Writes to a command's standard input (started with `stdin: true`, or a PTY).
   *
   * @param pid - the process's id (`handle.id`, `ProcessInfo.id`), or its guest pid (a number: `handle.pid`), looked up
   * @param data - text (UTF-8) or bytes
   */
  async sendStdin(pid: ProcessRef, data: string | Uint8Array): Promise<void> {
    await sendStdin(this.conn, this.sandboxId, await this.resolve(pid), data, false);
  }

  /**
   * Closes a command's standard input.
   *
   * @param pid - the process's id (`handle.id`, `ProcessInfo.id`), or its guest pid (a number: `handle.pid`), looked up
   */
  async closeStdin(pid: ProcessRef): Promise<void> {
    await sendStdin(this.conn, this.sandboxId, await this.resolve(pid), '', true);
  }

  /**
   * Kills a command if it runs and forgets it (it leaves {@link list}).
   *
   * @param pid - the process's id (`handle.id`, `ProcessInfo.id`), or its guest pid (a number: `handle.pid`), looked up
   * @returns false when the sandbox did not know it
   */
  async remove(pid: ProcessRef): Promise<boolean> {
    try {
      const res = await this.conn.request('DELETE', procPath(this.sandboxId, await this.resolve(pid)));
      res.resume();
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }
}
