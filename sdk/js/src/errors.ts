/**
 * The SDK's errors. Every error the SDK raises for the daemon's answers is a
 * {@link WarrenError}; the subclasses say what went wrong the way E2B's JS SDK
 * does (NotFoundError, AuthenticationError, TimeoutError, CommandExitError,
 * ...), so that `instanceof` checks port over.
 *
 * @module
 */

/**
 * The base class of the SDK's errors: a daemon's error answer (with its HTTP
 * status and, when the error came from the guest agent, its code), a broken
 * stream, or a misuse of the SDK.
 */
export class WarrenError extends Error {
  /** The HTTP status of the daemon's answer (0 when there was none). */
  readonly status: number;
  /**
   * The guest agent's error code, when the error came from it
   * ("not_found", "permission_denied", "exists", "is_directory", ...).
   */
  readonly code?: string;

  /**
   * @param message - what went wrong
   * @param status - the HTTP status (0: none)
   * @param code - the guest agent's error code, if any
   */
  constructor(message: string, status = 0, code?: string) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    if (code) this.code = code;
  }
}

/** A sandbox, template, process, snapshot or file that does not exist (404, or agent code "not_found"). */
export class NotFoundError extends WarrenError {}

/** The daemon refused the credentials: a missing or wrong token (401). */
export class AuthenticationError extends WarrenError {}

/** The request is not allowed: another tenant's, a revoked key (403), or a guest file's permissions (agent code "permission_denied"). */
export class PermissionDeniedError extends WarrenError {}

/** The daemon refused the request's arguments (400, or agent codes "bad_request", "is_directory", "not_directory"). */
export class InvalidArgumentError extends WarrenError {}

/** The request does not fit the sandbox's state, e.g. a command in a paused sandbox (409), or the file exists (agent code "exists"). */
export class ConflictError extends WarrenError {}

/** The daemon is busy (429): try again later. */
export class RateLimitError extends WarrenError {}

/** The daemon, or the guest agent behind it, failed (5xx). */
export class ServerError extends WarrenError {}

/** A request (408, 504, or the SDK's own bound on it), or a command with a timeout, ran out of time. */
export class TimeoutError extends WarrenError {}

/** The daemon could not be reached (no socket, refused, TLS failure). */
export class ConnectionError extends WarrenError {}

/**
 * A streaming answer (process output, a watch) broke and could not be
 * resumed. A process keeps running in the sandbox: `commands.connect`
 * comes back to it.
 */
export class StreamError extends WarrenError {}

/** How a command ended (the answer of a foreground `commands.run` and of `CommandHandle.wait`). */
export interface CommandResult {
  /** Everything the command wrote to its standard output (decoded as UTF-8). */
  stdout: string;
  /** Everything it wrote to its standard error (decoded as UTF-8). */
  stderr: string;
  /** Its exit code (-1 when a signal killed it and the guest reported none). */
  exitCode: number;
  /** Why it ended abnormally ("killed by SIGKILL", "timed out"), if it did. */
  error?: string;
  /** The signal that killed it, if one did. */
  signal?: string;
  /** The sandbox killed it at its timeout. */
  timedOut?: boolean;
  /** Output bytes the guest no longer kept when they were read (more than its 1 MiB replay buffer before being read). */
  dropped?: number;
}

/**
 * A command exited with a non-zero code: raised by a foreground
 * `commands.run` and by `CommandHandle.wait`, as E2B's SDK does. The error
 * carries the whole {@link CommandResult}.
 */
export class CommandExitError extends WarrenError implements CommandResult {
  /** The command's result. */
  readonly result: CommandResult;

  /** @param result - how the command ended */
  constructor(result: CommandResult) {
    super(
      `command exited with code ${result.exitCode}` +
        (result.error ? ` (${result.error})` : '') +
        (result.stderr ? `: ${truncate(result.stderr.trim(), 500)}` : ''),
      0,
    );
    this.result = result;
  }

  /** See {@link CommandResult.stdout}. */
  get stdout(): string {
    return this.result.stdout;
  }
  /** See {@link CommandResult.stderr}. */
  get stderr(): string {
    return this.result.stderr;
  }
  /** See {@link CommandResult.exitCode}. */
  get exitCode(): number {
    return this.result.exitCode;
  }
  /** See {@link CommandResult.error}. */
  get error(): string | undefined {
    return this.result.error;
  }
}

/**
 * A command the sandbox killed at its timeout (a {@link TimeoutError}, as
 * E2B raises, carrying the command's result).
 */
export class CommandTimeoutError extends TimeoutError {
  /** The command's result: the output it wrote until then. */
  readonly result: CommandResult;

  /** @param result - how the command ended */
  constructor(result: CommandResult) {
    super(`command timed out (exit code ${result.exitCode})`);
    this.result = result;
  }

  /** See {@link CommandResult.stdout}. */
  get stdout(): string {
    return this.result.stdout;
  }
  /** See {@link CommandResult.stderr}. */
  get stderr(): string {
    return this.result.stderr;
  }
  /** See {@link CommandResult.exitCode}. */
  get exitCode(): number {
    return this.result.exitCode;
  }
}

/**
 * A fork made fewer children than asked: `children` are the ones made
 * (running: kill them if unwanted), `errors` the daemon's reasons.
 */
export class ForkError extends WarrenError {
  /**
   * @param message - what went wrong
   * @param children - the children made (Sandbox objects)
   * @param errors - the daemon's reasons for the failed ones
   */
  constructor(
    message: string,
    readonly children: unknown[],
    readonly errors: string[],
  ) {
    super(message);
  }
}

function truncate(s: string, n: number): string {
  return s.length > n ? s.slice(0, n) + '...' : s;
}

/**
 * Turns a daemon's error answer into the matching error class: the body is
 * the daemon's JSON `{"error": "...", "code": "..."}` (or any text).
 *
 * @param status - the answer's HTTP status
 * @param body - the answer's body
 * @param what - what the request was, for the message ("GET /v1/sandboxes/x")
 */
export function errorFromResponse(status: number, body: string, what?: string): WarrenError {
  let message = '';
  let code: string | undefined;
  try {
    const j = JSON.parse(body);
    if (j && typeof j === 'object' && typeof j.error === 'string') {
      message = j.error;
      if (typeof j.code === 'string' && j.code) code = j.code;
    }
  } catch {
    // not JSON: the text itself
  }
  if (!message) message = body.trim() || `HTTP ${status}`;
  const full = what ? `${what}: ${message} (${status})` : `${message} (${status})`;
  if (status === 408 || status === 504) return new TimeoutError(full, status, code);
  if (code && status >= 400 && status < 500) {
    switch (code) {
      case 'not_found':
        return new NotFoundError(full, status, code);
      case 'permission_denied':
        return new PermissionDeniedError(full, status, code);
      case 'exists':
        return new ConflictError(full, status, code);
      case 'bad_request':
      case 'is_directory':
      case 'not_directory':
        return new InvalidArgumentError(full, status, code);
    }
  }
  switch (status) {
    case 400:
      return new InvalidArgumentError(full, status, code);
    case 401:
      return new AuthenticationError(full, status, code);
    case 403:
      return new PermissionDeniedError(full, status, code);
    case 404:
      return new NotFoundError(full, status, code);
    case 409:
      return new ConflictError(full, status, code);
    case 429:
      return new RateLimitError(full, status, code);
  }
  if (status >= 500) return new ServerError(full, status, code);
  return new WarrenError(full, status, code);
}
