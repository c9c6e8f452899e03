/**
 * The sandbox: create, connect, list, and a sandbox's life (pause, resume,
 * fork, snapshots, rollback, kill), with its commands, terminals and files.
 *
 * @module
 */
import { ConnectionConfig, ConnectionOpts, sandboxPath } from './connection.js';
import { Commands } from './commands.js';
import { ForkError, InvalidArgumentError, NotFoundError, ServerError } from './errors.js';
import { Filesystem } from './filesystem.js';
import { Pty } from './pty.js';

/** The default bound on a long operation (create, pause, resume, fork): 5 minutes. */
export const DEFAULT_LONG_TIMEOUT_MS = 5 * 60_000;

/** A sandbox's status. */
export type SandboxStatus = 'creating' | 'running' | 'paused' | 'suspended' | 'stopped' | 'failed';

/** A sandbox as the daemon describes it (`Sandbox.list`, `sandbox.getInfo()`). */
export interface SandboxInfo {
  /** Its id. */
  sandboxId: string;
  /** The template it was made from. */
  templateId: string;
  /** Its status ("running", "paused", "suspended" (paused to disk), "stopped", "failed", "creating"). */
  status: SandboxStatus;
  /** Why it failed or stopped, if it did. */
  reason?: string;
  /** Its labels ("name" is how the CLI finds a sandbox by name). */
  labels: Record<string, string>;
  /** E2B's name for `labels` (the same object). */
  metadata: Record<string, string>;
  /** The environment every process of it gets (its `envs` at create). */
  envs: Record<string, string>;
  /** Its VMM's memory limit in MiB (the guest's own size is its template's). */
  memMiB: number;
  /** Its VMM's CPU limit. */
  cpus: number;
  /** It has a (filtered) network. */
  network: boolean;
  /** The sandbox it was forked from, if any. */
  parent?: string;
  /** Its snapshots, oldest first. */
  snapshots: SnapshotInfo[];
  /** When it was created. */
  startedAt: Date;
  /** When its record last changed. */
  updatedAt: Date;
  /** The tenant it belongs to. */
  tenant: string;
}

/** A sandbox's snapshot. */
export interface SnapshotInfo {
  /** Its name: what {@link Sandbox.rollback} takes (E2B's snapshot id). */
  name: string;
  /** "full" or "incremental". */
  kind: string;
  /** When it was taken. */
  time: Date;
  /** The size of its memory layer in bytes. */
  layerBytes: number;
  /** How long the guest was paused for it, in ms. */
  pauseMs: number;
  /** Taken by the rolling snapshotter. */
  rolling: boolean;
}

/** What a rollback did. */
export interface RollbackInfo {
  /** The snapshot's name. */
  snapshot: string;
  /** How long the guest was paused, in ms. */
  pauseMs: number;
  /** The whole rollback in the VMM, in ms. */
  totalMs: number;
  /** Memory pages rewritten from the snapshot. */
  pagesWritten: number;
  /** Memory pages zeroed. */
  pagesCleared: number;
  /** The one-line summary (as `warren rollback` prints it). */
  line: string;
}

/** Options of {@link Sandbox.create}: the sandbox, and how to reach the daemon. */
export interface SandboxOpts extends ConnectionOpts {
  /** The template's id (default: the tenant's only ready template; an error if there are none or several). */
  template?: string;
  /** Environment variables every process of the sandbox gets. */
  envs?: Record<string, string>;
  /** Free-form labels ("name" is how the CLI finds a sandbox by name). */
  labels?: Record<string, string>;
  /** E2B's name for labels (merged with them; `labels` wins). */
  metadata?: Record<string, string>;
  /** Its VMM's memory limit in MiB (default the template's). */
  memMiB?: number;
  /** Its VMM's CPU limit (default the template's). */
  cpus?: number;
  /**
   * How long the create may take, in ms (default 5 minutes). Unlike E2B's
   * `timeoutMs` this is not the sandbox's lifetime: a Warren sandbox runs
   * until it is killed.
   */
  timeoutMs?: number;
  /** The egress policy (an ebpf/policy document, an object or JSON text; the template needs a network). */
  egress?: object | string;
  /** Names of the tenant's secrets the egress policy's credentials use. */
  secrets?: string[];
}

/** Options of {@link Sandbox.connect}. */
export interface SandboxConnectOpts extends ConnectionOpts {
  /** Resume a paused, suspended or stopped sandbox, as E2B's connect does (default true). */
  resume?: boolean;
}

/** Options of {@link Sandbox.list}. */
export interface SandboxListOpts extends ConnectionOpts {
  /** Keep the sandboxes with all these labels (E2B: `query.metadata`). */
  query?: { labels?: Record<string, string>; metadata?: Record<string, string>; state?: SandboxStatus[] };
}

/** The daemon's sandbox record (store.Sandbox), the fields the SDK reads. */
interface RawSandbox {
  id: string;
  tenant: string;
  template: string;
  status: SandboxStatus;
  reason?: string;
  mem_mib: number;
  cpus: number;
  network?: boolean;
  env?: string[];
  labels?: Record<string, string>;
  parent?: string;
  snapshots?: RawSnapshot[];
  created: string;
  updated: string;
}

interface RawSnapshot {
  name: string;
  kind: string;
  time: string;
  layer_bytes?: number;
  pause_ms?: number;
  rolling?: boolean;
}

/**
 * Converts the daemon's snapshot record.
 *
 * @param r - the record
 */
export function toSnapshotInfo(r: RawSnapshot): SnapshotInfo {
  return {
    name: r.name,
    kind: r.kind,
    time: new Date(r.time),
    layerBytes: r.layer_bytes ?? 0,
    pauseMs: r.pause_ms ?? 0,
    rolling: !!r.rolling,
  };
}

/**
 * Converts the daemon's sandbox record.
 *
 * @param r - the record
 */
export function toSandboxInfo(r: RawSandbox): SandboxInfo {
  const envs: Record<string, string> = {};
  for (const kv of r.env ?? []) {
    const i = kv.indexOf('=');
    if (i < 0) envs[kv] = '';
    else envs[kv.slice(0, i)] = kv.slice(i + 1);
  }
  const labels = { ...(r.labels ?? {}) };
  const info: SandboxInfo = {
    sandboxId: r.id,
    templateId: r.template,
    status: r.status,
    labels,
    metadata: labels,
    envs,
    memMiB: r.mem_mib ?? 0,
    cpus: r.cpus ?? 0,
    network: !!r.network,
    snapshots: (r.snapshots ?? []).map(toSnapshotInfo),
    startedAt: new Date(r.created),
    updatedAt: new Date(r.updated),
    tenant: r.tenant,
  };
  if (r.reason) info.reason = r.reason;
  if (r.parent) info.parent = r.parent;
  return info;
}

/**
 * A Warren sandbox: a microVM restored from a template, with its commands
 * (`commands`), terminals (`pty`) and files (`files`). Make one with
 * {@link Sandbox.create}, or reach an existing one with
 * {@link Sandbox.connect}.
 *
 * @example
 * ```ts
 * import { Sandbox } from '@warrenvm/sdk';
 * const sbx = await Sandbox.create({ template: 'tpl-...' });
 * const r = await sbx.commands.run('echo hello');
 * console.log(r.stdout);
 * await sbx.kill();
 * ```
 */
export class Sandbox {
  /** The sandbox's id. */
  readonly sandboxId: string;
  /** Its commands. */
  readonly commands: Commands;
  /** Its terminals. */
  readonly pty: Pty;
  /** Its files. */
  readonly files: Filesystem;
  /** How this object reaches the daemon. */
  readonly connectionConfig: ConnectionConfig;
  private info: SandboxInfo | undefined;

  /**
   * @internal Use {@link Sandbox.create} or {@link Sandbox.connect}.
   * @param sandboxId - the sandbox's id
   * @param conn - the connection
   * @param info - its record, if known
   */
  constructor(sandboxId: string, conn: ConnectionConfig, info?: SandboxInfo) {
    this.sandboxId = sandboxId;
    this.connectionConfig = conn;
    this.info = info;
    this.commands = new Commands(conn, sandboxId);
    this.pty = new Pty(conn, sandboxId, this.commands);
    this.files = new Filesystem(conn, sandboxId);
  }

  /**
   * Creates a sandbox from a template and resolves once it runs.
   *
   * @param opts - the template, envs, labels, limits, and the daemon (default the environment's)
   */
  static create(opts?: SandboxOpts): Promise<Sandbox>;
  /**
   * Creates a sandbox from the named template (E2B's `Sandbox.create(template, opts)`).
   *
   * @param template - the template's id
   * @param opts - envs, labels, limits, and the daemon
   */
  static create(template: string, opts?: SandboxOpts): Promise<Sandbox>;
  static async create(a?: string | SandboxOpts, b?: SandboxOpts): Promise<Sandbox> {
    const opts: SandboxOpts = typeof a === 'string' ? { ...(b ?? {}), template: a } : (a ?? {});
    const conn = new ConnectionConfig(opts);
    let template = opts.template;
    if (!template) {
      const l = (await conn.json<{ id: string; status: string }[]>('GET', '/v1/templates')) ?? [];
      const ready = l.filter((t) => t.status === 'ready').map((t) => t.id);
      if (ready.length !== 1) {
        throw new InvalidArgumentError(`no template given and the tenant has ${ready.length} ready templates (${ready.join(', ')}): name one`);
      }
      template = ready[0]!;
    }
    const body: Record<string, unknown> = { template };
    if (opts.envs && Object.keys(opts.envs).length) body.env = Object.entries(opts.envs).map(([k, v]) => `${k}=${v}`);
    const labels = { ...(opts.metadata ?? {}), ...(opts.labels ?? {}) };
    if (Object.keys(labels).length) body.labels = labels;
    if (opts.memMiB) body.mem_mib = Math.floor(opts.memMiB);
    if (opts.cpus) body.cpus = Math.floor(opts.cpus);
    if (opts.egress !== undefined) body.egress = typeof opts.egress === 'string' ? JSON.parse(opts.egress) : opts.egress;
    if (opts.secrets?.length) body.secrets = opts.secrets;
    const r = await conn.json<RawSandbox>('POST', '/v1/sandboxes', body, { timeoutMs: opts.timeoutMs ?? DEFAULT_LONG_TIMEOUT_MS });
    const info = toSandboxInfo(r);
    if (info.status === 'failed') throw new ServerError(`sandbox ${info.sandboxId} failed: ${info.reason ?? 'no reason given'}`, 500);
    return new Sandbox(info.sandboxId, conn, info);
  }

  /**
   * Reaches an existing sandbox by its id (or its "name" label). As E2B's, a
   * paused (or suspended, or stopped) sandbox is resumed unless
   * `resume: false`.
   *
   * @param sandboxId - the id, or the value of a "name" label naming exactly one sandbox
   * @param opts - resume, and the daemon
   * @throws NotFoundError when there is no such sandbox
   */
  static async connect(sandboxId: string, opts: SandboxConnectOpts = {}): Promise<Sandbox> {
    const conn = new ConnectionConfig(opts);
    let r: RawSandbox;
    try {
      r = await conn.json<RawSandbox>('GET', sandboxPath(sandboxId));
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
      const named = ((await conn.json<RawSandbox[]>('GET', '/v1/sandboxes')) ?? []).filter((s) => s.labels?.name === sandboxId);
      if (named.length !== 1) throw e;
      r = named[0]!;
    }
    const sb = new Sandbox(r.id, conn, toSandboxInfo(r));
    if ((opts.resume ?? true) && ['paused', 'suspended', 'stopped'].includes(r.status)) await sb.resume();
    return sb;
  }

  /**
   * The tenant's sandboxes, oldest first.
   *
   * @param opts - filters (labels, states), and the daemon
   */
  static async list(opts: SandboxListOpts = {}): Promise<SandboxInfo[]> {
    const conn = new ConnectionConfig(opts);
    const want = { ...(opts.query?.metadata ?? {}), ...(opts.query?.labels ?? {}) };
    const states = opts.query?.state;
    return ((await conn.json<RawSandbox[]>('GET', '/v1/sandboxes')) ?? [])
      .map(toSandboxInfo)
      .filter((s) => Object.entries(want).every(([k, v]) => s.labels[k] === v))
      .filter((s) => !states || states.includes(s.status));
  }

  /**
   * Kills a sandbox by its id: stops its VMM and deletes everything of it.
   *
   * @param sandboxId - the id
   * @param opts - the daemon
   * @returns false when there was no such sandbox
   */
  static async kill(sandboxId: string, opts: ConnectionOpts = {}): Promise<boolean> {
    return killSandbox(new ConnectionConfig(opts), sandboxId);
  }

  /** The sandbox's record now. */
  async getInfo(): Promise<SandboxInfo> {
    this.info = toSandboxInfo(await this.connectionConfig.json<RawSandbox>('GET', sandboxPath(this.sandboxId)));
    return this.info;
  }

  /** Whether the sandbox runs (not paused, suspended, stopped or gone). */
  async isRunning(): Promise<boolean> {
    try {
      return (await this.getInfo()).status === 'running';
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /**
   * Pauses the sandbox in memory, or with `toDisk` snapshots it and stops
   * its VMM (status "suspended"). Its processes pause with it and go on
   * after {@link resume}.
   *
   * @param opts - toDisk; timeoutMs (default 5 minutes)
   */
  async pause(opts: { toDisk?: boolean; timeoutMs?: number } = {}): Promise<SandboxInfo> {
    const path = sandboxPath(this.sandboxId, '/pause') + (opts.toDisk ? '?to_disk=true' : '');
    this.info = toSandboxInfo(await this.connectionConfig.json<RawSandbox>('POST', path, undefined, { timeoutMs: opts.timeoutMs ?? DEFAULT_LONG_TIMEOUT_MS }));
    return this.info;
  }

  /**
   * Resumes a paused sandbox, or restores a suspended or stopped one from
   * its latest snapshot.
   *
   * @param opts - timeoutMs (default 5 minutes)
   */
  async resume(opts: { timeoutMs?: number } = {}): Promise<SandboxInfo> {
    this.info = toSandboxInfo(
      await this.connectionConfig.json<RawSandbox>('POST', sandboxPath(this.sandboxId, '/resume'), undefined, {
        timeoutMs: opts.timeoutMs ?? DEFAULT_LONG_TIMEOUT_MS,
      }),
    );
    return this.info;
  }

  /**
   * Forks the running sandbox into `n` children (1 to 64): each a copy of
   * it at this instant, its processes included.
   *
   * @param n - how many (default 1)
   * @param opts - timeoutMs (default 5 minutes)
   * @throws ForkError when fewer than `n` were made (it carries the ones that were)
   */
  async fork(n = 1, opts: { timeoutMs?: number } = {}): Promise<Sandbox[]> {
    const r = await this.connectionConfig.json<{ children?: RawSandbox[]; errors?: string[] }>(
      'POST',
      sandboxPath(this.sandboxId, '/fork'),
      { n },
      { timeoutMs: opts.timeoutMs ?? DEFAULT_LONG_TIMEOUT_MS },
    );
    const kids = (r?.children ?? [])
      .map(toSandboxInfo)
      .filter((i) => i.status !== 'failed' && i.sandboxId)
      .map((i) => new Sandbox(i.sandboxId, this.connectionConfig, i));
    const errors = r?.errors ?? [];
    if (errors.length || kids.length < n) {
      throw new ForkError(`fork of ${this.sandboxId}: ${kids.length} of ${n} children: ${errors.join('; ')}`, kids, errors);
    }
    return kids;
  }

  /**
   * Takes a snapshot now; {@link rollback} goes back to it.
   *
   * @param opts - name (default snap-<UTC time>), incremental
   */
  async snapshot(opts: { name?: string; incremental?: boolean } = {}): Promise<SnapshotInfo> {
    const body: Record<string, unknown> = {};
    if (opts.name) body.name = opts.name;
    if (opts.incremental) body.incremental = true;
    return toSnapshotInfo(
      await this.connectionConfig.json<RawSnapshot>('POST', sandboxPath(this.sandboxId, '/snapshots'), body, { timeoutMs: DEFAULT_LONG_TIMEOUT_MS }),
    );
  }

  /** The sandbox's snapshots, oldest first. */
  async snapshots(): Promise<SnapshotInfo[]> {
    const r = await this.connectionConfig.json<{ snapshots?: RawSnapshot[] }>('GET', sandboxPath(this.sandboxId, '/snapshots'));
    return (r?.snapshots ?? []).map(toSnapshotInfo);
  }

  /**
   * Puts the running sandbox back to one of its snapshots, in place (its
   * processes too; output streams following them reconnect).
   *
   * @param snapshot - the snapshot's name, or its record
   */
  async rollback(snapshot: string | SnapshotInfo): Promise<RollbackInfo> {
    const name = typeof snapshot === 'string' ? snapshot : snapshot.name;
    const r = await this.connectionConfig.json<Record<string, unknown>>('POST', sandboxPath(this.sandboxId, '/rollback'), { snapshot: name }, {
      timeoutMs: DEFAULT_LONG_TIMEOUT_MS,
    });
    return {
      snapshot: String(r?.snapshot ?? name),
      pauseMs: Number(r?.pause_ms ?? 0),
      totalMs: Number(r?.total_ms ?? 0),
      pagesWritten: Number(r?.pages_written ?? 0),
      pagesCleared: Number(r?.pages_cleared ?? 0),
      line: String(r?.line ?? ''),
    };
  }

  /**
   * Kills the sandbox: stops its VMM and deletes everything of it.
   *
   * @returns false when it was already gone
   */
  async kill(): Promise<boolean> {
    return killSandbox(this.connectionConfig, this.sandboxId);
  }
}

async function killSandbox(conn: ConnectionConfig, id: string): Promise<boolean> {
  try {
    await conn.json('DELETE', sandboxPath(id), undefined, { timeoutMs: DEFAULT_LONG_TIMEOUT_MS });
    return true;
  } catch (e) {
    if (e instanceof NotFoundError) return false;
    throw e;
  }
}
