/**
 * How the SDK reaches warren-hostd: its address ($WARREN_HOST: a unix
 * socket path, `unix://PATH`, or an http:// or https:// URL), the tenant
 * ($WARREN_TENANT, in the X-Warren-Tenant header) and the bearer token of a
 * TCP daemon ($WARREN_TOKEN), as the warren CLI and the Go client
 * (hostd/client) do; and the HTTP requests themselves, on Node's standard
 * library only.
 *
 * @module
 */
import * as http from 'node:http';
import * as https from 'node:https';
import { readFileSync } from 'node:fs';
import { Readable } from 'node:stream';
import { Buffer } from 'node:buffer';
import { ConnectionError, WarrenError, TimeoutError, errorFromResponse } from './errors.js';

/** The daemon's default unix socket. */
export const DEFAULT_SOCKET = '/run/warren/hostd.sock';

/** The header that names the tenant of a request. */
export const TENANT_HEADER = 'X-Warren-Tenant';

/** The default bound on an ordinary request (not a stream, not a long operation): 60 s. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;

/**
 * Where the daemon is: a unix socket, or an HTTP(S) origin with an optional
 * base path.
 */
export type Endpoint =
  | { kind: 'unix'; socketPath: string }
  | { kind: 'http' | 'https'; hostname: string; port: number; basePath: string };

/**
 * Parses a daemon address as the warren CLI does: `""` (the default socket),
 * a unix socket path with or without `unix://`, or an `http://` or
 * `https://` URL.
 *
 * @param host - the address
 * @throws WarrenError on a URL without a host or of another scheme
 */
export function parseHost(host: string | undefined): Endpoint {
  const h = host ?? '';
  if (h === '') return { kind: 'unix', socketPath: DEFAULT_SOCKET };
  if (h.startsWith('http://') || h.startsWith('https://')) {
    let u: URL;
    try {
      u = new URL(h);
    } catch {
      throw new WarrenError(`bad daemon address ${JSON.stringify(h)}`);
    }
    if (!u.hostname) throw new WarrenError(`bad daemon address ${JSON.stringify(h)}`);
    const https_ = u.protocol === 'https:';
    const hostname = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname;
    return {
      kind: https_ ? 'https' : 'http',
      hostname,
      port: u.port ? Number(u.port) : https_ ? 443 : 80,
      basePath: u.pathname.replace(/\/+$/, ''),
    };
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(h) && !h.startsWith('unix://')) {
    throw new WarrenError(`bad daemon address ${JSON.stringify(h)}: a unix socket path, unix://PATH, http:// or https:// URL`);
  }
  return { kind: 'unix', socketPath: h.startsWith('unix://') ? h.slice('unix://'.length) : h };
}

/**
 * How to reach the daemon: every option defaults to the environment, as the
 * warren CLI's flags do.
 */
export interface ConnectionOpts {
  /** The daemon: a unix socket path (or `unix://PATH`) or an http:// or https:// URL (default $WARREN_HOST, else /run/warren/hostd.sock). */
  host?: string;
  /** The tenant to act as (default $WARREN_TENANT; on a unix socket "default"; on TCP the token's when unset). */
  tenant?: string;
  /** The bearer token of a TCP daemon (default $WARREN_TOKEN). */
  token?: string;
  /** Bound on an ordinary request, in ms (default 60 000; 0: none). Streams and long operations have their own. */
  requestTimeoutMs?: number;
  /** PEM roots an https:// daemon's certificate must chain to (default: the file $WARREN_CA names, else the system's). */
  ca?: string | Buffer;
  /** PEM client certificate for an https:// daemon that asks for one (default: the file $WARREN_CLIENT_CERT names). */
  cert?: string | Buffer;
  /** The PEM key of `cert` (default: the file $WARREN_CLIENT_KEY names). */
  key?: string | Buffer;
}

/** A request body: JSON is sent by {@link ConnectionConfig.json}; these are raw bytes. */
export type Body = string | Uint8Array | Readable | AsyncIterable<Uint8Array | string>;

/** Options of one request. */
export interface RequestOpts {
  /** Raw body (Content-Type application/octet-stream unless `headers` says otherwise). */
  body?: Body;
  /** A JSON body (Content-Type application/json). */
  json?: unknown;
  /** More headers. */
  headers?: Record<string, string>;
  /**
   * Bound in ms until the answer's headers have come (and, with
   * `wholeBody`, its body too); undefined: the connection's
   * requestTimeoutMs; 0: none.
   */
  timeoutMs?: number;
  /** Aborts the request (and its answer's stream). */
  signal?: AbortSignal;
}

/** The options of Node's http.request that a request of this connection uses (exported for tests). */
export interface BuiltRequest {
  options: http.RequestOptions;
  https: boolean;
}

function envOr(v: string | undefined, name: string): string | undefined {
  return v !== undefined ? v : process.env[name] || undefined;
}

function fileFromEnv(name: string): Buffer | undefined {
  const p = process.env[name];
  if (!p) return undefined;
  try {
    return readFileSync(p);
  } catch (e) {
    throw new WarrenError(`${name}: ${(e as Error).message}`);
  }
}

const agents = new Map<string, http.Agent>();

function agentFor(kind: 'unix' | 'http' | 'https'): http.Agent {
  let a = agents.get(kind);
  if (!a) {
    // Keep-alive sockets are unref'd while idle: they never hold the process.
    a = kind === 'https' ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true });
    agents.set(kind, a);
  }
  return a;
}

/**
 * A connection to one daemon as one tenant: the settings, resolved from
 * options and the environment, and the requests.
 */
export class ConnectionConfig {
  /** The daemon's address as given (or from $WARREN_HOST). */
  readonly host: string;
  /** The tenant named in each request's header ("" on TCP without one: the token's). */
  readonly tenant: string;
  /** The bearer token ("" for none). */
  readonly token: string;
  /** Bound on an ordinary request, in ms (0: none). */
  readonly requestTimeoutMs: number;
  /** The parsed address. */
  readonly endpoint: Endpoint;
  private readonly tls: { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer };

  /**
   * @param opts - the settings; each absent one comes from the environment
   * @throws WarrenError on a bad address
   */
  constructor(opts: ConnectionOpts = {}) {
    this.host = envOr(opts.host, 'WARREN_HOST') ?? DEFAULT_SOCKET;
    this.endpoint = parseHost(this.host);
    let tenant = envOr(opts.tenant, 'WARREN_TENANT') ?? '';
    if (tenant === '' && this.endpoint.kind === 'unix') tenant = 'default';
    this.tenant = tenant;
    this.token = envOr(opts.token, 'WARREN_TOKEN') ?? '';
    this.requestTimeoutMs = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.tls = {};
    if (this.endpoint.kind === 'https') {
      // As the CLI: the $WARREN_CA family applies to https:// daemons only.
      this.tls.ca = opts.ca ?? fileFromEnv('WARREN_CA');
      this.tls.cert = opts.cert ?? fileFromEnv('WARREN_CLIENT_CERT');
      this.tls.key = opts.key ?? fileFromEnv('WARREN_CLIENT_KEY');
      if (!this.tls.cert !== !this.tls.key) throw new WarrenError('a client certificate needs both its certificate and its key');
    } else if (opts.ca || opts.cert || opts.key) {
      throw new WarrenError(`a CA or client certificate needs an https:// daemon address, not ${JSON.stringify(this.host)}`);
    }
  }

  /** The options to pass on to another object of the same daemon and tenant. */
  get opts(): ConnectionOpts {
    return { host: this.host, tenant: this.tenant, token: this.token, requestTimeoutMs: this.requestTimeoutMs, ...this.tls };
  }

  /**
   * The headers every request carries: the tenant (when set) and the bearer
   * token (when set).
   */
  headers(): Record<string, string> {
    const h: Record<string, string> = {};
    if (this.tenant) h[TENANT_HEADER] = this.tenant;
    if (this.token) h['Authorization'] = `Bearer ${this.token}`;
    return h;
  }

  /**
   * Builds the options of Node's http.request for a request (no I/O).
   *
   * @param method - the HTTP method
   * @param path - the API path with its query ("/v1/sandboxes?...")
   * @param headers - more headers
   */
  build(method: string, path: string, headers: Record<string, string> = {}): BuiltRequest {
    const e = this.endpoint;
    const h = { ...this.headers(), ...headers };
    if (e.kind === 'unix') {
      return {
        https: false,
        options: { method, path, headers: { Host: 'hostd', ...h }, socketPath: e.socketPath, agent: agentFor('unix') },
      };
    }
    const o: https.RequestOptions = { method, hostname: e.hostname, port: e.port, path: e.basePath + path, headers: h, agent: agentFor(e.kind) };
    if (e.kind === 'https' && (this.tls.ca || this.tls.cert)) {
      // Own certificates: no shared agent (its pool would mix them).
      o.agent = false;
      if (this.tls.ca) o.ca = this.tls.ca;
      if (this.tls.cert) {
        o.cert = this.tls.cert;
        o.key = this.tls.key;
      }
    }
    return { https: e.kind === 'https', options: o };
  }

  /**
   * Sends a request and returns the answer once its headers have come; a
   * status of 300 or more becomes the matching {@link WarrenError} (the
   * answer's body read and dropped). The caller reads (or drops) the body.
   *
   * @param method - the HTTP method
   * @param path - the API path with its query
   * @param opts - body, headers, timeout, abort signal
   */
  async request(method: string, path: string, opts: RequestOpts = {}): Promise<http.IncomingMessage> {
    const { res, done } = await this.send(method, path, opts, false);
    done();
    return res;
  }

  /**
   * Sends a request and decodes its JSON answer (undefined for an empty
   * one); the timeout covers the whole body.
   *
   * @param method - the HTTP method
   * @param path - the API path with its query
   * @param body - the JSON body, if any
   * @param opts - more options
   */
  async json<T>(method: string, path: string, body?: unknown, opts: RequestOpts = {}): Promise<T> {
    const o = { ...opts };
    if (body !== undefined) o.json = body;
    const { res, done } = await this.send(method, path, o, true);
    try {
      const text = (await readAll(res)).toString('utf8');
      if (text.trim() === '') return undefined as T;
      try {
        return JSON.parse(text) as T;
      } catch {
        throw new WarrenError(`warren-hostd: bad answer to ${method} ${path.split('?')[0]}: ${text.slice(0, 200)}`, res.statusCode ?? 0);
      }
    } finally {
      done();
    }
  }

  private send(
    method: string,
    path: string,
    opts: RequestOpts,
    wholeBody: boolean,
    retried = false,
  ): Promise<{ res: http.IncomingMessage; done: () => void }> {
    const headers: Record<string, string> = {};
    let body: Body | undefined = opts.body;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers['Content-Type'] = 'application/json';
    } else if (body !== undefined) {
      headers['Content-Type'] = 'application/octet-stream';
    }
    if (typeof body === 'string' || body instanceof Uint8Array) {
      headers['Content-Length'] = String(typeof body === 'string' ? Buffer.byteLength(body) : body.byteLength);
    }
    Object.assign(headers, opts.headers);
    const { options, https: isHttps } = this.build(method, path, headers);
    const timeoutMs = opts.timeoutMs ?? this.requestTimeoutMs;
    const what = `${method} ${path.split('?')[0]}`;
    return new Promise((resolve, reject) => {
      const req = (isHttps ? https : http).request(options);
      let timer: NodeJS.Timeout | undefined;
      let settled = false;
      let res: http.IncomingMessage | undefined;
      // done ends the timeout; the abort signal stays on the answer's
      // stream until it closes.
      const done = () => {
        if (timer) clearTimeout(timer);
        timer = undefined;
      };
      const unlisten = () => opts.signal?.removeEventListener('abort', onAbort);
      const fail = (err: Error) => {
        if (res) res.destroy(err);
        req.destroy(err);
        if (!settled) {
          settled = true;
          done();
          unlisten();
          reject(err);
        }
      };
      const onAbort = () => {
        const r = opts.signal?.reason;
        fail(r instanceof Error ? r : new WarrenError(`${what}: aborted`));
      };
      if (opts.signal) {
        if (opts.signal.aborted) return onAbort();
        opts.signal.addEventListener('abort', onAbort, { once: true });
      }
      if (timeoutMs > 0) {
        timer = setTimeout(() => fail(new TimeoutError(`${what}: no answer within ${timeoutMs} ms`)), timeoutMs);
      }
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (settled) return;
        // A kept-alive socket the daemon closed meanwhile: once more, when
        // nothing of the body was streamed.
        if (!retried && req.reusedSocket && err.code === 'ECONNRESET' && !(body instanceof Readable) && !isAsyncIterable(body)) {
          settled = true;
          done();
          unlisten();
          this.send(method, path, opts, wholeBody, true).then(resolve, reject);
          return;
        }
        const e = err instanceof WarrenError ? err : new ConnectionError(`warren-hostd at ${this.host}: ${what}: ${err.message}`);
        if (!(err instanceof WarrenError)) (e as { cause?: unknown }).cause = err;
        fail(e);
      });
      req.on('response', (r) => {
        res = r;
        r.on('close', unlisten);
        const status = r.statusCode ?? 0;
        if (status >= 300) {
          readAll(r, 64 << 10).then(
            (b) => fail(errorFromResponse(status, b.toString('utf8'), what)),
            (e) => fail(e),
          );
          return;
        }
        if (settled) return;
        settled = true;
        if (!wholeBody) done();
        resolve({ res: r, done });
      });
      if (body === undefined) {
        req.end();
      } else if (typeof body === 'string' || body instanceof Uint8Array) {
        req.end(body);
      } else {
        const src = body instanceof Readable ? body : Readable.from(body);
        src.on('error', (e) => fail(new WarrenError(`${what}: reading the body: ${e.message}`)));
        src.pipe(req);
      }
    });
  }
}

function isAsyncIterable(v: unknown): boolean {
  return v != null && typeof (v as AsyncIterable<unknown>)[Symbol.asyncIterator] === 'function';
}

/**
 * Reads a whole answer body (at most `limit` bytes; more is dropped).
 *
 * @param r - the answer
 * @param limit - the most bytes kept
 */
export async function readAll(r: AsyncIterable<Buffer | string>, limit = Infinity): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const c of r) {
    const b = typeof c === 'string' ? Buffer.from(c) : c;
    if (n < limit) parts.push(n + b.length > limit ? b.subarray(0, limit - n) : b);
    n += b.length;
  }
  return Buffer.concat(parts);
}

/**
 * Builds a query string from the defined values ("" when none): `?a=1&b=x`.
 *
 * @param params - the parameters; undefined ones are left out
 */
export function query(params: Record<string, string | number | boolean | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined) continue;
    q.set(k, typeof v === 'boolean' ? (v ? '1' : '0') : String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

/**
 * The API path of a sandbox, with `rest` appended.
 *
 * @param id - the sandbox's id
 * @param rest - the rest of the path ("/processes", ...)
 */
export function sandboxPath(id: string, rest = ''): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}${rest}`;
}
