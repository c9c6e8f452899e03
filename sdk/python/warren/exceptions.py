"""The errors the SDK raises: a :class:`WarrenError` hierarchy.

The daemon answers an error with a status and a JSON body
``{"error": "...", "code": "..."}`` (``code`` set when the error came from
the guest agent: ``not_found``, ``permission_denied``, ``exists``, ...).
:func:`error_from_response` maps that onto the classes below.
"""

from __future__ import annotations

import builtins
import json
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .models import CommandResult
    from .sandbox import Sandbox

__all__ = [
    "WarrenError",
    "ApiError",
    "InvalidArgumentError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "RateLimitError",
    "ServerError",
    "TimeoutError",
    "ConnectionError",
    "StreamError",
    "CommandExitError",
    "CommandTimeoutError",
    "ForkError",
    "error_from_response",
]


class WarrenError(Exception):
    """The base class of every error the SDK raises."""


class ApiError(WarrenError):
    """An error answer of the daemon.

    Attributes:
        status: the HTTP status (0 for an error that came inside a stream).
        message: the daemon's message.
        code: the guest agent's error code, when the error came from it
            (``"not_found"``, ``"permission_denied"``, ``"exists"``, ...).
    """

    def __init__(self, message: str, status: int = 0, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        extra = []
        if self.status:
            extra.append(str(self.status))
        if self.code:
            extra.append(self.code)
        return f"{self.message} ({', '.join(extra)})" if extra else self.message


class InvalidArgumentError(ApiError):
    """400: the daemon refused the request as malformed."""


class AuthenticationError(ApiError):
    """401: no token, or a token the daemon does not accept."""


class PermissionDeniedError(ApiError):
    """403: the caller may not act for this tenant, or the guest refused (``permission_denied``)."""


class NotFoundError(ApiError):
    """404: no such sandbox, template, process or guest file."""


class ConflictError(ApiError):
    """409: the object is in the wrong state (a sandbox that is not running, a file that exists)."""


class RateLimitError(ApiError):
    """429: the daemon's admission control refused the request for now."""


class ServerError(ApiError):
    """5xx: the daemon or the guest agent failed."""


class TimeoutError(WarrenError, builtins.TimeoutError):  # noqa: A001 (E2B names it so too)
    """A request or a command ran past its timeout.

    It is also Python's built-in ``TimeoutError``, so ``except TimeoutError``
    catches it either way.
    """


class ConnectionError(WarrenError, builtins.ConnectionError):  # noqa: A001
    """The daemon could not be reached (no socket, refused, TLS failure)."""


class StreamError(WarrenError):
    """A streaming answer (process output, a watch) broke and could not be resumed.

    A process keeps running in the sandbox; the handle that raised this
    may ``wait()`` again, and resumes from the output offset it had.
    """


class CommandExitError(WarrenError):
    """A foreground command exited with a non-zero code (or was killed by a signal).

    Like E2B's ``CommandExitException``, it carries the whole result:
    ``stdout``, ``stderr``, ``exit_code`` and ``error``.
    """

    def __init__(self, result: "CommandResult") -> None:
        self.result = result
        msg = f"command exited with code {result.exit_code}"
        if result.error:
            msg += f" ({result.error})"
        if result.stderr:
            tail = result.stderr.strip().splitlines()[-1:] or [""]
            msg += f": {tail[0][:200]}"
        super().__init__(msg)

    @property
    def stdout(self) -> str:
        """The command's standard output, decoded as UTF-8."""
        return self.result.stdout

    @property
    def stderr(self) -> str:
        """The command's standard error, decoded as UTF-8."""
        return self.result.stderr

    @property
    def exit_code(self) -> int:
        """The exit code (128+N when signal N killed it)."""
        return self.result.exit_code

    @property
    def error(self) -> Optional[str]:
        """Why it ended abnormally (a signal, its timeout), if it did."""
        return self.result.error


class CommandTimeoutError(CommandExitError, TimeoutError):
    """A command the daemon killed at its ``timeout``; also a :class:`TimeoutError`."""


class ForkError(WarrenError):
    """A fork made fewer children than asked.

    Attributes:
        children: the children that were made (already running: kill them
            if you do not want them).
        errors: the daemon's reasons for each failed child.
    """

    def __init__(self, message: str, children: "List[Sandbox]", errors: List[str]) -> None:
        super().__init__(message)
        self.children = children
        self.errors = errors


_BY_STATUS: Dict[int, Type[ApiError]] = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    429: RateLimitError,
}

_BY_CODE: Dict[str, Type[ApiError]] = {
    "not_found": NotFoundError,
    "permission_denied": PermissionDeniedError,
    "exists": ConflictError,
    "bad_request": InvalidArgumentError,
    "is_directory": InvalidArgumentError,
    "not_directory": InvalidArgumentError,
}


class _ApiTimeoutError(ApiError, TimeoutError):
    """408 or 504 from the daemon: an :class:`ApiError` that is also a :class:`TimeoutError`."""


def error_class(status: int, code: Optional[str] = None) -> Type[ApiError]:
    """Return the :class:`ApiError` subclass for an HTTP status and agent code."""
    if status in (408, 504):
        return _ApiTimeoutError
    if code and code in _BY_CODE and (status == 400 or (400 <= status < 500 and status not in _BY_STATUS)):
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ServerError
    return ApiError


def error_from_response(status: int, body: bytes) -> ApiError:
    """Build the error for a daemon's answer with ``status`` and ``body``.

    The body is the daemon's JSON ``{"error": ..., "code": ...}``; anything
    else is taken as a plain-text message.
    """
    message = ""
    code: Optional[str] = None
    try:
        doc: Any = json.loads(body.decode("utf-8", "replace")) if body else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"]:
        message = doc["error"]
        c = doc.get("code")
        code = c if isinstance(c, str) and c else None
    else:
        message = body.decode("utf-8", "replace").strip()[:4096]
    if not message:
        from http import HTTPStatus

        try:
            message = HTTPStatus(status).phrase
        except ValueError:
            message = f"HTTP {status}"
    return error_class(status, code)(message, status, code)
