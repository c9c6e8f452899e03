/**
 * A sandbox's guest files: read and write (streamed both ways), list, stat,
 * mkdir, remove, rename and watch (`sandbox.files`). Paths are the guest's
 * and absolute.
 *
 * @module
 */
import { Blob } from 'node:buffer';
import { Readable } from 'node:stream';
import { ConnectionConfig, query, readAll, sandboxPath } from './connection.js';
import { ConflictError, InvalidArgumentError, NotFoundError, WarrenError } from './errors.js';
import { readNDJSON } from './ndjson.js';

/** A guest file's record as the daemon answers it (agentwire.FileInfo). */
export interface RawFileInfo {
  name: string;
  size: number;
  /** Go's fs.FileMode: type bits in the high bits, permissions in the low ones. */
  mode: number;
  mod_time: string;
  is_dir: boolean;
  link?: string;
  path?: string;
}

/** The type of a file. */
export type FileType = 'file' | 'dir' | 'symlink';

/** E2B's FileType names, for code that compares with them. */
export const FileType = { FILE: 'file', DIR: 'dir', SYMLINK: 'symlink' } as const;

/** A guest file: `files.list`'s entries and `files.getInfo`'s answer (E2B's EntryInfo). */
export interface EntryInfo {
  /** The base name. */
  name: string;
  /** The absolute path. */
  path: string;
  /** "file", "dir" or "symlink" (other kinds, devices or pipes, are "file"). */
  type: FileType;
  /** The size in bytes. */
  size: number;
  /** The permission bits (0o755 for rwxr-xr-x), with setuid (0o4000), setgid (0o2000) and sticky (0o1000). */
  mode: number;
  /** The permissions as `ls -l` writes them ("rwxr-xr-x"). */
  permissions: string;
  /** The modification time. */
  modifiedTime: Date;
  /** A symbolic link's target. */
  symlinkTarget?: string;
}

// Go's fs.FileMode bits.
const MODE_DIR = 2 ** 31;
const MODE_SYMLINK = 2 ** 27;
const MODE_SETUID = 2 ** 23;
const MODE_SETGID = 2 ** 22;
const MODE_STICKY = 2 ** 20;

function hasBit(mode: number, bit: number): boolean {
  return Math.floor(mode / bit) % 2 === 1;
}

/**
 * Converts a daemon's file record to an {@link EntryInfo}.
 *
 * @param r - the record
 * @param path - the file's path, for an answer without one
 */
export function toEntryInfo(r: RawFileInfo, path?: string): EntryInfo {
  const m = r.mode >>> 0;
  let type: FileType = 'file';
  if (r.is_dir || hasBit(m, MODE_DIR)) type = 'dir';
  else if (r.link !== undefined || hasBit(m, MODE_SYMLINK)) type = 'symlink';
  let mode = m & 0o777;
  if (hasBit(m, MODE_SETUID)) mode |= 0o4000;
  if (hasBit(m, MODE_SETGID)) mode |= 0o2000;
  if (hasBit(m, MODE_STICKY)) mode |= 0o1000;
  const e: EntryInfo = {
    name: r.name,
    path: r.path || path || r.name,
    type,
    size: r.size,
    mode,
    permissions: permString(m & 0o777),
    modifiedTime: new Date(r.mod_time),
  };
  if (r.link) e.symlinkTarget = r.link;
  return e;
}

function permString(p: number): string {
  const rwx = 'rwxrwxrwx';
  let s = '';
  for (let i = 0; i < 9; i++) s += p & (1 << (8 - i)) ? rwx[i] : '-';
  return s;
}

/** What `files.write` takes: text (UTF-8), bytes, a Blob, or a stream of bytes (a Node Readable, a web ReadableStream, any async iterable). */
export type WriteData = string | Uint8Array | ArrayBuffer | Blob | Readable | AsyncIterable<Uint8Array | string>;

/** One file of a multi-file `files.write`. */
export interface WriteEntry {
  /** The guest path. */
  path: string;
  /** The contents. */
  data: WriteData;
}

/** Options of `files.write`. */
export interface WriteOpts {
  /** The permission bits (default 0o644). */
  mode?: number;
  /** Bound on the upload in ms (default: none, it streams). */
  requestTimeoutMs?: number;
}

/** A filesystem event's type (E2B's FilesystemEventType values). */
export type FilesystemEventType = 'create' | 'write' | 'remove' | 'rename' | 'chmod' | 'overflow';

/** E2B's FilesystemEventType names, for code that compares with them. */
export const FilesystemEventType = {
  CREATE: 'create',
  WRITE: 'write',
  REMOVE: 'remove',
  RENAME: 'rename',
  CHMOD: 'chmod',
  OVERFLOW: 'overflow',
} as const;

/** A change under a watched directory. */
export interface FilesystemEvent {
  /** The path relative to the watched directory (E2B's `name`). */
  name: string;
  /** The absolute guest path changed. */
  path: string;
  /** What happened; "rename" is the old name moving away (its new name comes as a "create"); "overflow": events were lost. */
  type: FilesystemEventType;
  /** The path is a directory. */
  isDir: boolean;
  /** When the guest's agent saw it (guest clock). */
  time: Date;
}

/** Options of `files.watchDir`. */
export interface WatchOpts {
  /** Watch subdirectories too (and the ones created later). */
  recursive?: boolean;
  /** Called once when the watch ends: with the error that ended it, or none after `stop()`. */
  onExit?: (err?: Error) => void | Promise<void>;
  /** Bound in ms on setting the watch up (default the connection's request timeout). */
  timeoutMs?: number;
}

/** A running watch. */
export interface WatchHandle {
  /** Stops the watch. */
  stop(): Promise<void>;
}

/** The guest files of one sandbox: `sandbox.files`. */
export class Filesystem {
  /** @internal Use `sandbox.files`. */
  constructor(
    private readonly conn: ConnectionConfig,
    private readonly sandboxId: string,
  ) {}

  private p(rest: string, params: Record<string, string | number | boolean | undefined>): string {
    return sandboxPath(this.sandboxId, rest) + query(params);
  }

  /**
   * Reads a file as text (UTF-8; the default).
   *
   * @param path - the guest path
   */
  read(path: string, opts?: { format?: 'text'; requestTimeoutMs?: number }): Promise<string>;
  /** Reads a file as bytes. */
  read(path: string, opts: { format: 'bytes'; requestTimeoutMs?: number }): Promise<Uint8Array>;
  /** Reads a file as a stream (a Node Readable of its bytes, as they come). */
  read(path: string, opts: { format: 'stream'; requestTimeoutMs?: number }): Promise<Readable>;
  /** Reads a file as a Blob. */
  read(path: string, opts: { format: 'blob'; requestTimeoutMs?: number }): Promise<Blob>;
  async read(
    path: string,
    opts: { format?: 'text' | 'bytes' | 'stream' | 'blob'; requestTimeoutMs?: number } = {},
  ): Promise<string | Uint8Array | Readable | Blob> {
    const format = opts.format ?? 'text';
    // The timeout bounds the wait for the answer; a stream then takes its time.
    const res = await this.conn.request('GET', this.p('/files', { path }), { timeoutMs: opts.requestTimeoutMs });
    if (format === 'stream') return res;
    const b = await readAll(res);
    if (format === 'bytes') return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    if (format === 'blob') return new Blob([b]);
    return b.toString('utf8');
  }

  /**
   * Writes (replaces) a file, streaming its contents; the parent directory
   * must exist.
   *
   * @param path - the guest path
   * @param data - text (UTF-8), bytes, or a stream (a Node Readable or any async iterable of chunks)
   * @param opts - the permission bits (default 0o644)
   * @returns the file written
   */
  write(path: string, data: WriteData, opts?: WriteOpts): Promise<EntryInfo>;
  /** Writes several files, one after the other (E2B's multi-file form). */
  write(files: WriteEntry[], opts?: WriteOpts): Promise<EntryInfo[]>;
  async write(a: string | WriteEntry[], b?: WriteData | WriteOpts, c?: WriteOpts): Promise<EntryInfo | EntryInfo[]> {
    if (Array.isArray(a)) {
      const out: EntryInfo[] = [];
      for (const f of a) out.push(await this.writeOne(f.path, f.data, (b as WriteOpts) ?? {}));
      return out;
    }
    if (b === undefined) throw new InvalidArgumentError('files.write: no data');
    return this.writeOne(a, b as WriteData, c ?? {});
  }

  private async writeOne(path: string, data: WriteData, opts: WriteOpts): Promise<EntryInfo> {
    const mode = (opts.mode ?? 0o644) & 0o7777;
    let body: string | Uint8Array | Readable | AsyncIterable<Uint8Array | string>;
    if (data instanceof ArrayBuffer) body = new Uint8Array(data);
    else if (data instanceof Blob) body = data.stream() as unknown as AsyncIterable<Uint8Array>;
    else body = data;
    const fi = await this.conn.json<RawFileInfo>('PUT', this.p('/files', { path, mode: mode.toString(8) }), undefined, {
      body,
      timeoutMs: opts.requestTimeoutMs ?? 0,
    });
    return toEntryInfo(fi, path);
  }

  /**
   * Lists a directory.
   *
   * @param path - the guest directory
   * @param opts - depth: 1 (the default) lists its entries, 2 their entries too, ... (at most 32)
   */
  async list(path: string, opts: { depth?: number } = {}): Promise<EntryInfo[]> {
    const l = await this.conn.json<RawFileInfo[]>('GET', this.p('/files/list', { path, depth: opts.depth }));
    const dir = path.replace(/\/+$/, '');
    return (l ?? []).map((f) => toEntryInfo(f, `${dir}/${f.name}`));
  }

  /**
   * Says whether a path exists.
   *
   * @param path - the guest path
   */
  async exists(path: string): Promise<boolean> {
    try {
      await this.getInfo(path);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /**
   * A file's record (lstat: a symbolic link's own).
   *
   * @param path - the guest path
   * @throws NotFoundError when there is none
   */
  async getInfo(path: string): Promise<EntryInfo> {
    return toEntryInfo(await this.conn.json<RawFileInfo>('GET', this.p('/files/stat', { path })), path);
  }

  /**
   * Makes a directory and its missing parents.
   *
   * @param path - the guest path
   * @param opts - the permission bits (default 0o755)
   * @returns true if it was made, false if a directory was already there (E2B's answer)
   */
  async makeDir(path: string, opts: { mode?: number } = {}): Promise<boolean> {
    try {
      const fi = await this.getInfo(path);
      if (fi.type === 'dir') return false;
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
    try {
      await this.conn.json('POST', this.p('/files/mkdir', { path, parents: 1, mode: ((opts.mode ?? 0o755) & 0o777).toString(8) }));
      return true;
    } catch (e) {
      if (e instanceof ConflictError && (await this.getInfo(path).catch(() => undefined))?.type === 'dir') return false;
      throw e;
    }
  }

  /**
   * Removes a file, or a directory with everything in it.
   *
   * @param path - the guest path
   */
  async remove(path: string): Promise<void> {
    await this.conn.json('DELETE', this.p('/files', { path, recursive: 1 }));
  }

  /**
   * Renames (moves) a file or directory.
   *
   * @param oldPath - the guest path now
   * @param newPath - the new one
   * @returns the file under its new name
   */
  async rename(oldPath: string, newPath: string): Promise<EntryInfo> {
    const fi = await this.conn.json<RawFileInfo>('POST', sandboxPath(this.sandboxId, '/files/rename'), { from: oldPath, to: newPath });
    return toEntryInfo(fi, newPath);
  }

  /**
   * Watches a directory: `onEvent` gets each change until `stop()`. Resolves
   * once the watch is in place (changes made after that are seen).
   *
   * @param path - the guest directory
   * @param onEvent - called with each change
   * @param opts - recursive, onExit, timeoutMs
   */
  async watchDir(path: string, onEvent: (e: FilesystemEvent) => void | Promise<void>, opts: WatchOpts = {}): Promise<WatchHandle> {
    const ac = new AbortController();
    let stopped = false;
    const res = await this.conn.request('GET', this.p('/files/watch', { path, recursive: opts.recursive ? 1 : undefined }), {
      headers: { Accept: 'application/x-ndjson' },
      signal: ac.signal,
      timeoutMs: opts.timeoutMs,
    });
    const base = path.replace(/\/+$/, '');
    const it = readNDJSON<{ op: string; path: string; is_dir?: boolean; time: string; error?: string }>(res);
    // The first line is "ready": the watches are in place.
    const first = await Promise.race([
      it.next(),
      new Promise<never>((_, rej) => {
        const t = opts.timeoutMs ?? this.conn.requestTimeoutMs;
        if (t > 0) setTimeout(() => rej(new WarrenError(`watch ${path}: not ready within ${t} ms`)), t).unref();
      }),
    ]).catch((e) => {
      ac.abort();
      throw e;
    });
    if (first.done || first.value.error !== undefined || first.value.op !== 'ready') {
      ac.abort();
      throw new WarrenError(`watch ${path}: ${first.done ? 'the stream ended' : (first.value.error ?? `first event ${first.value.op}, not ready`)}`);
    }
    const loop = async (): Promise<Error | undefined> => {
      for await (const ev of { [Symbol.asyncIterator]: () => it }) {
        if (ev.error !== undefined) return new WarrenError(`watch ${path}: ${ev.error}`, 502);
        if (ev.op === 'ready') continue;
        const rel = ev.path === base ? '' : ev.path.startsWith(base + '/') ? ev.path.slice(base.length + 1) : ev.path;
        await onEvent({ name: rel, path: ev.path, type: ev.op as FilesystemEventType, isDir: !!ev.is_dir, time: new Date(ev.time) });
      }
      return stopped ? undefined : new WarrenError(`watch ${path}: the stream ended`);
    };
    const ended = loop().then(
      (e) => (stopped ? undefined : e),
      (e) => (stopped ? undefined : (e as Error)),
    ).then(async (e) => {
      if (opts.onExit) await opts.onExit(e);
    }).catch(() => {});
    return {
      stop: async () => {
        stopped = true;
        ac.abort();
        res.destroy();
        await ended;
      },
    };
  }
}
