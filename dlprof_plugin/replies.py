"""The request/reply layer of the HTTP API (http_api.md), shared by the service and every route module: the
`Reply` a route returns, JSON replies, reading a request's parameters, and `PublicError`, the one error type a
route raises to answer with an HTTP status (modelled on TensorBoard's `tensorboard.errors.PublicError`: its
text is shown to the client, so it never holds more than the request and the file already say)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

JSON = "application/json"
MAX_PARAM_LEN = 4096
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass
class Reply:
    status: int
    body: bytes | str
    content_type: str = JSON
    headers: list = field(default_factory=list)


class PublicError(Exception):
    """An error answered as `{"error": message, **extra}` with its HTTP status (`http_code`)."""

    http_code = 500

    def __init__(self, message: str, extra: dict | None = None, http_code: int | None = None):
        super().__init__(message)
        self.message, self.extra = message, dict(extra or {})
        if http_code is not None:
            self.http_code = http_code

    def reply(self) -> Reply:
        return error_reply(self.http_code, self.message, self.extra)


class BadRequest(PublicError):
    """A malformed parameter (HTTP 400)."""

    http_code = 400


class NotFound(PublicError):
    """An unknown run, aggregation, domain, table, iteration, op ... (HTTP 404)."""

    http_code = 404


class MethodNotAllowed(PublicError):
    """A route asked with another HTTP method than it serves (HTTP 405)."""

    http_code = 405


class Conflict(PublicError):
    """The request conflicts with work in progress (HTTP 409)."""

    http_code = 409


class TooLarge(PublicError):
    """A page or export larger than allowed (HTTP 413)."""

    http_code = 413


class Unavailable(PublicError):
    """The database cannot be read now (HTTP 503)."""

    http_code = 503


def finite(value):
    """JSON has no NaN or infinity: they are sent as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_reply(doc, status: int = 200, headers=None, sanitize: bool = True) -> Reply:
    body = json.dumps(finite(doc) if sanitize else doc, separators=(",", ":"), allow_nan=False)
    return Reply(status, body, JSON, list(headers or []))


def error_reply(status: int, message: str, extra: dict | None = None) -> Reply:
    return json_reply({"error": message, **(extra or {})}, status)


def clip(text, n: int = 80) -> str:
    """A value quoted in an error message, cut to `n` characters."""
    text = str(text)
    return text if len(text) <= n else text[:n] + "..."


def json_field(text):
    """A JSON column's value decoded (the text itself when it is not JSON)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def check_method(request, allowed) -> None:
    if request.method not in allowed:
        raise MethodNotAllowed(f"method {request.method} not allowed; use {' or '.join(allowed)}")


def arg(request, name: str, default=None):
    """A query parameter (refused when longer than MAX_PARAM_LEN)."""
    value = request.args.get(name, default)
    if value is not None and len(value) > MAX_PARAM_LEN:
        raise BadRequest(f"parameter '{name}' is too long")
    return value


def check_name(value: str, what: str) -> None:
    """Names of runs and domains are never paths: refuse path tricks outright (400)."""
    if (
        "\x00" in value
        or value.startswith(("/", "\\"))
        or re.match(r"^[A-Za-z]:[\\/]", value)
        or any(part == ".." for part in re.split(r"[\\/]", value))
    ):
        raise BadRequest(f"invalid {what} '{clip(value)}'")


def int_arg(request, name: str, default=None, minimum: int | None = 0, required: bool = False):
    """An integer query parameter (within SQLite's int64, at least `minimum`)."""
    text = arg(request, name)
    if text is None or text == "":
        if required:
            raise BadRequest(f"parameter '{name}' is required")
        return default
    if not re.fullmatch(r"\s*[-+]?\d+\s*", text):
        raise BadRequest(f"parameter '{name}' must be an integer, got '{clip(text)}'")
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:  # what SQLite stores (times are ns: 292 years)
        raise BadRequest(f"parameter '{name}' must be between {INT64_MIN} and {INT64_MAX}, got '{clip(text)}'")
    if minimum is not None and value < minimum:
        raise BadRequest(f"parameter '{name}' must be at least {minimum}")
    return value
