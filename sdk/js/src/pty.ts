/**
 * Terminals (PTYs) in a sandbox: a process on a new pseudo-terminal whose
 * output comes as raw bytes, with input and resizing. Like commands, a
 * terminal's process outlives its client's connection.
 *
 * @module
 */
import { Buffer } from 'node:buffer';
import { ConnectionConfig, sandboxPath } from './connection.js';
import { CommandHandle, Commands, DEFAULT_COMMAND_TIMEOUT_MS, ProcessInfo, ProcessRef, RawProcessInfo, toProcessInfo } from './commands.js';

/** A terminal's size in characters. */
export interface PtySize {
  /** Rows (lines). */
  rows: number;
  /** Columns. */
  cols: number;
}

/** Options of {@link Pty.create}. */
export interface PtyCreateOpts extends PtySize {
  /** Called with the terminal's output (raw bytes) as it comes. */
  onData?: (data: Uint8Array) => void | Promise<void>;
  /** The working directory. */
  cwd?: string;
  /** Environment variables (TERM defaults to xterm-256color). */
  envs?: Record<string, string>;
  /** The user to run as. */
  user?: string;
  /**
   * The command: a shell command line (run with /bin/sh -c) or an argv
   * (default: an interactive login shell, bash when the guest has it).
   */
  cmd?: string | string[];
  /** Kill the terminal's process after this many ms (default 0: never; E2B's default is 60 000). */
  timeoutMs?: number;
  /** A free-form label reported back by `commands.list`. */
  tag?: string;
}

/** The default command of a terminal: bash -i -l when the guest has it, else sh -i. */
export const DEFAULT_PTY_CMD = [
  '/bin/sh',
  '-c',
  'if command -v bash >/dev/null 2>&1; then exec bash -i -l; else exec sh -i; fi',
];

/**
 * A terminal: a {@link CommandHandle} (its output is all `stdout`) with
 * input and resizing.
 */
export class PtyHandle extends CommandHandle {
  /**
   * Types into the terminal.
   *
   * @param data - text (UTF-8) or bytes, as keystrokes ("ls\n", "\x03" for ^C)
   */
  async sendInput(data: string | Uint8Array): Promise<void> {
    await this.sendStdin(data);
  }

  /**
   * Resizes the terminal (the process gets SIGWINCH).
   *
   * @param size - the new size
   */
  async resize(size: PtySize): Promise<ProcessInfo> {
    return resize(this.conn, this.sandboxId, this.id, size);
  }
}

async function resize(conn: ConnectionConfig, sandboxId: string, id: string, size: PtySize): Promise<ProcessInfo> {
  return toProcessInfo(
    await conn.json<RawProcessInfo>('POST', sandboxPath(sandboxId, `/processes/${encodeURIComponent(id)}/resize`), {
      rows: size.rows,
      cols: size.cols,
    }),
  );
}

/** The terminals of one sandbox: `sandbox.pty`. */
export class Pty {
  /** @internal Use `sandbox.pty`. */
  constructor(
    private readonly conn: ConnectionConfig,
    private readonly sandboxId: string,
    private readonly commands: Commands,
  ) {}

  /**
   * Starts a process on a new terminal of the given size.
   *
   * @param opts - size, onData, cwd, envs, user, cmd, timeoutMs
   * @returns its handle (`wait()` resolves when the process exits)
   */
  async create(opts: PtyCreateOpts): Promise<PtyHandle> {
    const info = await this.commands.start(
      opts.cmd ?? DEFAULT_PTY_CMD,
      { cwd: opts.cwd, envs: opts.envs, user: opts.user, timeoutMs: opts.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS, tag: opts.tag },
      false,
      { rows: opts.rows, cols: opts.cols },
    );
    return new PtyHandle({ conn: this.conn, sandboxId: this.sandboxId, info, offset: 0, onData: opts.onData });
  }

  /**
   * Comes back to a terminal's process from any client.
   *
   * @param pid - the process's id (`handle.id`), or its guest pid (a number: `handle.pid`), looked up
   * @param opts - onData, and fromStart (default true: replay the output kept; false: from now on)
   */
  async connect(pid: ProcessRef, opts: { onData?: (data: Uint8Array) => void | Promise<void>; fromStart?: boolean } = {}): Promise<PtyHandle> {
    const id = await this.commands.resolve(pid);
    const info = await this.conn.json<RawProcessInfo>('GET', sandboxPath(this.sandboxId, `/processes/${encodeURIComponent(id)}`));
    return new PtyHandle({ conn: this.conn, sandboxId: this.sandboxId, info, offset: opts.fromStart === false ? info.output_bytes : undefined, onData: opts.onData });
  }

  /**
   * Types into a terminal.
   *
   * @param pid - the process's id (`handle.id`), or its guest pid (a number: `handle.pid`), looked up
   * @param data - text (UTF-8) or bytes
   */
  async sendInput(pid: ProcessRef, data: string | Uint8Array): Promise<void> {
    await this.commands.sendStdin(pid, typeof data === 'string' ? Buffer.from(data, 'utf8') : data);
  }

  /**
   * Resizes a terminal.
   *
   * @param pid - the process's id (`handle.id`), or its guest pid (a number: `handle.pid`), looked up
   * @param size - the new size
   */
  async resize(pid: ProcessRef, size: PtySize): Promise<ProcessInfo> {
    return resize(this.conn, this.sandboxId, await this.commands.resolve(pid), size);
  }

  /**
   * Kills a terminal's process.
   *
   * @param pid - the process's id (`handle.id`), or its guest pid (a number: `handle.pid`), looked up
   * @returns false if it was not found or had already exited
   */
  async kill(pid: ProcessRef): Promise<boolean> {
    return this.commands.kill(pid);
  }
}
