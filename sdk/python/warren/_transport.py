"""How the SDK reaches warren-hostd: http.client over the daemon's unix
socket (the default) or over TCP (http:// or https://, with a bearer
token), as the ``warren`` CLI does.

Settings come from the arguments, else the environment: ``WARREN_HOST``
(a socket path, ``unix://PATH``, or an ``http(s)://`` URL; default
``/run/warren/hostd.sock``), ``WARREN_TENANT``, ``WARREN_TOKEN``, and for
https ``WARREN_CA``, ``WARREN_CLIENT_CERT``, ``WARREN_CLIENT_KEY``.

Plain calls open a connection each (a unix socket's connect is cheap);
streaming calls (process output, watches, downloads) always get a
connection of their own, read line by line with a bounded line length.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
from typing import IO, Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from . import exceptions as exc

DEFAULT_SOCKET = "/run/warren/hostd.sock"
"""The daemon's default unix socket."""

TENANT_HEADER = "X-Warren-Tenant"
"""The header that names a request's tenant."""

MAX_LINE = 4 << 20
"""The longest NDJSON line a stream may send (the daemon's largest frame, base64-encoded, with room)."""

DEFAULT_REQUEST_TIMEOUT = 60.0
"""Seconds a plain call may take, unless a call says otherwise."""

LONG_OPERATION_TIMEOUT = 600.0
"""Seconds a long operation (create, fork, resume, pause to disk, snapshot, rollback) may take by default:
the daemon bounds each of its own steps (a guest agent that does not answer within 2 minutes fails it)."""

UPLOAD_CHUNK = 256 << 10
"""Bytes read from a file-like object per chunk of a streamed upload."""

Query = Mapping[str, Union[str, int, bool, None]]


class UnixHTTPConnection(http.client.HTTPConnection):
    """An :class:`http.client.HTTPConnection` to a unix socket."""

    def __init__(self, path: str, timeout: Optional[float] = None) -> None:
        super().__init__("hostd", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        """Connect to the socket at ``socket_path``."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self.socket_path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class ConnectionConfig:
    """Where the daemon is and who the caller is.

    Args:
        host: a unix socket path (``unix://`` prefix optional) or an
            ``http://`` / ``https://`` URL; default ``$WARREN_HOST``, else
            ``/run/warren/hostd.sock``.
        tenant: the tenant to act as; default ``$WARREN_TENANT``, else on a
            unix socket ``"default"`` (on TCP the token's tenant rules, and
            the header is sent only when a tenant is set).
        token: the bearer token of a TCP daemon; default ``$WARREN_TOKEN``.
        request_timeout: seconds a plain call may take (``None``: no limit).
        ca_file, cert_file, key_file: for https, the CA bundle to check the
            daemon's certificate against (default the system's) and a
            client certificate; default ``$WARREN_CA``,
            ``$WARREN_CLIENT_CERT``, ``$WARREN_CLIENT_KEY``.
    """

    def __init__(
        self,
        host: Optional[str] = None,
        tenant: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
        ca_file: Optional[str] = None,
        cert_file: Optional[str] = None,
        key_file: Optional[str] = None,
    ) -> None:
        host = host or os.environ.get("WARREN_HOST") or DEFAULT_SOCKET
        self.host = host
        self.token = token if token is not None else (os.environ.get("WARREN_TOKEN") or None)
        tenant = tenant if tenant is not None else (os.environ.get("WARREN_TENANT") or None)
        self.request_timeout = request_timeout
        self.scheme: str
        self.socket_path: Optional[str] = None
        self.netloc = ""
        self.base_path = ""
        self.ssl_context: Optional[ssl.SSLContext] = None
        if host.startswith("http://") or host.startswith("https://"):
            u = urlsplit(host)
            if not u.netloc:
                raise exc.InvalidArgumentError(f"bad daemon address {host!r}")
            self.scheme = u.scheme
            self.netloc = u.netloc
            self.base_path = u.path.rstrip("/")
            if u.scheme == "https":
                ca = ca_file or os.environ.get("WARREN_CA") or None
                cert = cert_file or os.environ.get("WARREN_CLIENT_CERT") or None
                key = key_file or os.environ.get("WARREN_CLIENT_KEY") or None
                if (cert is None) != (key is None):
                    raise exc.InvalidArgumentError("a client certificate needs both its certificate and its key")
                ctx = ssl.create_default_context(cafile=ca)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                if cert:
                    ctx.load_cert_chain(cert, key)
                self.ssl_context = ctx
            elif ca_file or cert_file or key_file:
                raise exc.InvalidArgumentError(f"a CA file or client certificate needs an https:// daemon address, not {host!r}")
        else:
            if ca_file or cert_file or key_file:
                raise exc.InvalidArgumentError(f"a CA file or client certificate needs an https:// daemon address, not {host!r}")
            self.scheme = "unix"
            self.socket_path = host[len("unix://"):] if host.startswith("unix://") else host
            if tenant is None:
                tenant = "default"
        self.tenant = tenant

    def __repr__(self) -> str:
        return f"ConnectionConfig(host={self.host!r}, tenant={self.tenant!r}, token={'***' if self.token else None})"

    def headers(self) -> Dict[str, str]:
        """The headers every request carries: the tenant and the bearer token."""
        h: Dict[str, str] = {}
        if self.tenant:
            h[TENANT_HEADER] = self.tenant
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        return h

    def connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        """A new (not yet connected) connection to the daemon."""
        if self.scheme == "unix":
            assert self.socket_path is not None
            return UnixHTTPConnection(self.socket_path, timeout=timeout)
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.netloc, timeout=timeout, context=self.ssl_context)
        return http.client.HTTPConnection(self.netloc, timeout=timeout)


def build_path(path: str, query: Optional[Query] = None) -> str:
    """``path`` with ``query`` appended, leaving out ``None`` values; booleans become ``1``/``0``."""
    if not query:
        return path
    items: List[Tuple[str, str]] = []
    for k, v in query.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "1" if v else "0"
        items.append((k, str(v)))
    if not items:
        return path
    return path + "?" + urlencode(items)


def seg(s: str) -> str:
    """``s`` escaped as one path segment."""
    return quote(s, safe="")


def _chunks(data: Union[IO[bytes], IO[str], Iterable[bytes]]) -> Iterator[bytes]:
    """The bytes of a file-like object (text ones encoded as UTF-8) or an iterable, in chunks."""
    read = getattr(data, "read", None)
    if read is not None:
        while True:
            b = read(UPLOAD_CHUNK)
            if not b:
                return
            yield b.encode("utf-8") if isinstance(b, str) else bytes(b)
    else:
        for b in data:  # type: ignore[union-attr]
            if b:
                yield b.encode("utf-8") if isinstance(b, str) else bytes(b)


class Stream:
    """An open streaming answer: the response and the connection it came on.

    Read it with :meth:`lines` (NDJSON) or :meth:`read`; :meth:`close` (or
    :meth:`abort` from another thread) ends it.
    """

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self.conn = conn
        self.resp = resp
        self._closed = False
        self._lock = threading.Lock()

    @property
    def headers(self) -> http.client.HTTPMessage:
        """The answer's headers."""
        return self.resp.headers

    def read(self, n: int = -1) -> bytes:
        """Read up to ``n`` bytes of the body (all when ``n`` < 0); ``b""`` at its end."""
        try:
            return self.resp.read(n) if n >= 0 else self.resp.read()
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
            if self._closed:
                return b""
            raise exc.StreamError(f"the stream broke: {e}") from e

    def read1(self, n: int = 64 << 10) -> bytes:
        """Read what is available, at most ``n`` bytes, waiting only for the first."""
        try:
            return self.resp.read1(n)
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
            if self._closed:
                return b""
            raise exc.StreamError(f"the stream broke: {e}") from e

    def lines(self, max_line: int = MAX_LINE) -> Iterator[Dict[str, Any]]:
        """The body's NDJSON lines, decoded, until the stream ends.

        A line longer than ``max_line`` or not a JSON object raises
        :class:`StreamError`; so does a broken connection (unless closed
        here).
        """
        while True:
            try:
                line = self.resp.readline(max_line + 1)
            except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
                if self._closed:
                    return
                raise exc.StreamError(f"the stream broke: {e}") from e
            if not line:
                return
            if len(line) > max_line and not line.endswith(b"\n"):
                raise exc.StreamError(f"a stream line is longer than {max_line} bytes")
            line = line.strip()
            if not line:
                continue
            try:
                doc = json.loads(line)
            except ValueError as e:
                raise exc.StreamError(f"bad stream line {line[:100]!r}: {e}") from e
            if not isinstance(doc, dict):
                raise exc.StreamError(f"bad stream line {line[:100]!r}: not an object")
            yield doc

    def abort(self) -> None:
        """End the stream from any thread: shut the socket down, so a blocked read returns."""
        with self._lock:
            self._closed = True
            sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Close the answer and its connection."""
        with self._lock:
            self._closed = True
        try:
            self.resp.close()
        finally:
            self.conn.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


class Transport:
    """Sends requests to one daemon as one tenant (see :class:`ConnectionConfig`)."""

    def __init__(self, config: ConnectionConfig) -> None:
        self.config = config

    def open(
        self,
        method: str,
        path: str,
        query: Optional[Query] = None,
        json_body: Any = None,
        body: Union[bytes, IO[bytes], IO[str], Iterable[bytes], None] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Union[float, None, str] = "default",
    ) -> Stream:
        """Send a request on a new connection and return its answer, unread.

        ``json_body`` is sent as JSON; ``body`` as raw bytes (``bytes`` with
        a Content-Length; a file-like object or an iterable of bytes streamed
        with chunked transfer encoding, never read whole). An error answer
        raises its :class:`ApiError`. ``timeout`` is the socket timeout
        (``None``: none; by default the config's ``request_timeout``).
        """
        if timeout == "default":
            timeout = self.config.request_timeout
        assert timeout is None or isinstance(timeout, (int, float))
        h = self.config.headers()
        payload: Any = None
        chunked = False
        if json_body is not None:
            payload = json.dumps(json_body).encode("utf-8")
            h["Content-Type"] = "application/json"
        elif body is not None:
            h["Content-Type"] = "application/octet-stream"
            if isinstance(body, (bytes, bytearray, memoryview)):
                payload = bytes(body)
            else:
                payload = _chunks(body)
                chunked = True
        if headers:
            h.update(headers)
        if payload is None and method in ("POST", "PUT"):
            payload = b""
        url = self.config.base_path + build_path(path, query)
        conn = self.config.connection(timeout)
        try:
            try:
                conn.request(method, url, body=payload, headers=h, encode_chunked=chunked)
            except (BrokenPipeError, ConnectionResetError):
                # The daemon may have answered (an error) before reading
                # the whole body: its answer says why.
                if conn.sock is None:
                    raise
            resp = conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise exc.TimeoutError(f"{method} {path}: timed out after {timeout} s") from e
        except ssl.SSLError as e:
            conn.close()
            raise exc.ConnectionError(f"{method} {path}: TLS: {e}") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise exc.ConnectionError(f"warren-hostd at {self.config.host}: {method} {path}: {e}") from e
        except BaseException:
            conn.close()
            raise
        if resp.status >= 300:
            try:
                data = resp.read(64 << 10)
            except (OSError, http.client.HTTPException):
                data = b""
            finally:
                conn.close()
            raise exc.error_from_response(resp.status, data)
        return Stream(conn, resp)

    def call(
        self,
        method: str,
        path: str,
        query: Optional[Query] = None,
        json_body: Any = None,
        body: Union[bytes, IO[bytes], IO[str], Iterable[bytes], None] = None,
        timeout: Union[float, None, str] = "default",
    ) -> Any:
        """Send a request and return its decoded JSON answer (``None`` for an empty one)."""
        with self.open(method, path, query, json_body=json_body, body=body, timeout=timeout) as s:
            try:
                data = s.resp.read()
            except socket.timeout as e:
                raise exc.TimeoutError(f"{method} {path}: timed out reading the answer") from e
            except (OSError, http.client.HTTPException) as e:
                raise exc.ConnectionError(f"{method} {path}: {e}") from e
        if not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise exc.WarrenError(f"bad answer to {method} {path}: {e}") from e
