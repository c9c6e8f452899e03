/**
 * Reading the daemon's NDJSON streams (process output, file watches, long
 * operations' progress) with a bound on the length of a line, and the
 * base64 of their output frames.
 *
 * @module
 */
import { Buffer } from 'node:buffer';
import { WarrenError } from './errors.js';

/**
 * The longest NDJSON line the SDK accepts (4 MiB): the guest agent's largest
 * output frame, base64-encoded, with room to spare. A longer line is the
 * stream's error, not a reason to buffer without bound.
 */
export const MAX_LINE_BYTES = 4 << 20;

/**
 * Splits a byte stream into lines (without their `\n`; a `\r` before it is
 * dropped too), holding at most `maxLine` bytes of an unfinished line. Blank
 * lines are skipped. A last line without its `\n` (the stream was cut) is
 * yielded too; the caller's JSON parse tells a cut line apart.
 *
 * @param source - the bytes: a Node Readable, or any async iterable of chunks
 * @param maxLine - the longest line accepted, in bytes
 * @throws WarrenError when a line is longer than `maxLine`
 */
export async function* readLines(
  source: AsyncIterable<Uint8Array | string>,
  maxLine: number = MAX_LINE_BYTES,
): AsyncGenerator<Buffer> {
  let parts: Buffer[] = [];
  let partLen = 0;
  for await (const c of source) {
    let chunk = typeof c === 'string' ? Buffer.from(c) : Buffer.from(c.buffer, c.byteOffset, c.byteLength);
    for (;;) {
      const nl = chunk.indexOf(0x0a);
      if (nl < 0) {
        if (chunk.length > 0) {
          partLen += chunk.length;
          if (partLen > maxLine) throw new WarrenError(`NDJSON line longer than ${maxLine} bytes`);
          parts.push(Buffer.from(chunk)); // a copy: the source may reuse its buffer
        }
        break;
      }
      if (partLen + nl > maxLine) throw new WarrenError(`NDJSON line longer than ${maxLine} bytes`);
      let line = parts.length ? Buffer.concat([...parts, chunk.subarray(0, nl)]) : chunk.subarray(0, nl);
      parts = [];
      partLen = 0;
      if (line.length && line[line.length - 1] === 0x0d) line = line.subarray(0, line.length - 1);
      if (line.length) yield line;
      chunk = chunk.subarray(nl + 1);
    }
  }
  if (partLen) yield Buffer.concat(parts);
}

/**
 * Reads an NDJSON stream as JSON values, one per line ({@link readLines}'s
 * bound applies).
 *
 * @param source - the bytes of the stream
 * @param maxLine - the longest line accepted, in bytes
 * @throws WarrenError on a line that is not JSON (a cut stream) or too long
 */
export async function* readNDJSON<T = unknown>(
  source: AsyncIterable<Uint8Array | string>,
  maxLine: number = MAX_LINE_BYTES,
): AsyncGenerator<T> {
  for await (const line of readLines(source, maxLine)) {
    let v: T;
    try {
      v = JSON.parse(line.toString('utf8')) as T;
    } catch {
      throw new WarrenError(`bad NDJSON line (the stream was cut?): ${line.toString('utf8', 0, Math.min(line.length, 120))}`);
    }
    yield v;
  }
}

/**
 * Decodes standard base64 (Go's encoding of `[]byte` in JSON) into bytes.
 *
 * @param s - the base64 text (empty or absent: no bytes)
 */
export function decodeBase64(s: string | undefined | null): Uint8Array {
  if (!s) return new Uint8Array(0);
  const b = Buffer.from(s, 'base64');
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

/**
 * One line of a process's output stream (`GET .../processes/{pid}/output`)
 * or of a foreground exec, as the daemon writes it: exactly one of `start`,
 * `stdout`, `stderr` (base64), `exit` (with `signal`, `timed_out`) or
 * `error`.
 */
export interface OutputFrame {
  /** First frame of an output stream: where it starts and how much was no longer kept. */
  start?: { offset: number; dropped?: number };
  /** Standard output bytes (base64); a terminal's output is all stdout. */
  stdout?: string;
  /** Standard error bytes (base64). */
  stderr?: string;
  /** The exit code, in the last frame once the process has exited. */
  exit?: number;
  /** The signal that killed the process, with `exit`. */
  signal?: string;
  /** The process's timeout killed it, with `exit`. */
  timed_out?: boolean;
  /** The stream broke (the last frame instead of `exit`): reconnect from the offset reached. */
  error?: string;
}
