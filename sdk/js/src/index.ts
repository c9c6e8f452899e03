/**
 * `@warrenvm/sdk`: the TypeScript/JavaScript SDK of Warren, the microVM
 * sandbox runtime for AI agents. It speaks warren-hostd's HTTP API (over
 * its unix socket, or TCP with a bearer token) with Node's standard library
 * only, and has the surface of E2B's JS SDK: `Sandbox.create`,
 * `sandbox.commands.run`, `sandbox.files.read`, ...
 *
 * @packageDocumentation
 */
export { Sandbox, DEFAULT_LONG_TIMEOUT_MS } from './sandbox.js';
export type { SandboxInfo, SandboxOpts, SandboxConnectOpts, SandboxListOpts, SandboxStatus, SnapshotInfo, RollbackInfo } from './sandbox.js';
export { Commands, CommandHandle, DEFAULT_COMMAND_TIMEOUT_MS, RECONNECT_WINDOW_MS, toArgv, toEnvList } from './commands.js';
export type { CommandStartOpts, CommandConnectOpts, ProcessInfo, ProcessRef, OutputChunk, ExitInfo } from './commands.js';
export { Pty, PtyHandle, DEFAULT_PTY_CMD } from './pty.js';
export type { PtySize, PtyCreateOpts } from './pty.js';
export { Filesystem, FileType, FilesystemEventType, toEntryInfo } from './filesystem.js';
export type { EntryInfo, FilesystemEvent, WatchHandle, WatchOpts, WriteData, WriteEntry, WriteOpts } from './filesystem.js';
export { ConnectionConfig, parseHost, query, DEFAULT_SOCKET, TENANT_HEADER, DEFAULT_REQUEST_TIMEOUT_MS } from './connection.js';
export type { ConnectionOpts, Endpoint, RequestOpts } from './connection.js';
export { readLines, readNDJSON, decodeBase64, MAX_LINE_BYTES } from './ndjson.js';
export type { OutputFrame } from './ndjson.js';
export {
  WarrenError,
  NotFoundError,
  AuthenticationError,
  PermissionDeniedError,
  InvalidArgumentError,
  ConflictError,
  RateLimitError,
  ServerError,
  TimeoutError,
  ConnectionError,
  StreamError,
  CommandExitError,
  CommandTimeoutError,
  ForkError,
  errorFromResponse,
} from './errors.js';
export type { CommandResult } from './errors.js';
export { Sandbox as default } from './sandbox.js';
