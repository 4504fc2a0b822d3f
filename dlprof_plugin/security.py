"""Request checks of the viewer's HTTP server, shared by the TensorBoard plugin and dlprofviewer: a local web
server must not be drivable by the web sites its user visits.

- DNS rebinding: a server bound to a loopback address answers only requests whose `Host` is an IP address or
  a loopback name (`localhost`, `*.localhost`), or a name the user allowed (`--allowed_hosts` for dlprofviewer,
  `--dlprof_allowed_hosts` for TensorBoard). A rebound attacker name reaches the server with its own name as
  `Host`; an IP address cannot be rebound. Bound to other addresses, any `Host` is served unless names were
  given.
- Cross-site requests: a request that may change state (any method but GET, HEAD, OPTIONS) needs the header
  `X-DLProf-Request` (an HTML form cannot set a header; a cross-origin script that sets one needs a CORS
  preflight, which this server never grants), a JSON body (`Content-Type: application/json`), and, when the
  browser names the page it comes from (`Origin`, else `Referer`), that page's host and port must be `Host`.
  `Origin: null` (sandboxed or file pages) is refused.
- Request bodies: at most MAX_BODY bytes. A larger `Content-Length` is refused (413) before a byte of the
  body is read, and a chunked body is read only up to the limit (read_body), so a client streaming a
  terabyte costs the server nothing.

Every refusal is a 403 (413 for a body) with a one-line reason.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from dataclasses import dataclass

REQUEST_HEADER = "X-DLProf-Request"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_BODY = 64 * 1024  # bytes; the largest body a route takes (reaggregate's JSON) is well under 1 KiB


@dataclass(frozen=True)
class HostPolicy:
    """Which `Host` names a server answers: any, or (loopback binding) IP addresses, loopback names and
    `allowed`. `flag` is the option that extends `allowed`, named in refusals."""

    restricted: bool
    allowed: frozenset = frozenset()
    flag: str = "--allowed_hosts"


def parse_allowed(values) -> frozenset:
    """Host names from a comma-separated string or a list of them (lower case, no port, no trailing dot)."""
    if values is None:
        return frozenset()
    if isinstance(values, str):
        values = [values]
    names = set()
    for value in values:
        for name in str(value).split(","):
            name = split_host(name.strip())[0]
            if name:
                names.add(name)
    return frozenset(names)


def _ip(name: str):
    try:
        return ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return None


def is_loopback_name(name: str) -> bool:
    name = name.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")


def is_loopback_address(host: str | None) -> bool:
    """Whether binding to `host` serves only this machine (loopback addresses, or a name resolving only
    to them). None is TensorBoard's default, localhost."""
    if host is None or is_loopback_name(host):
        return True
    ip = _ip(host.strip("[]"))
    if ip is not None:
        return ip.is_loopback
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(_ip(info[4][0]) is not None and _ip(info[4][0]).is_loopback for info in infos)


def policy_for_bind(
    host: str | None, bind_all: bool = False, allowed=None, flag: str = "--allowed_hosts"
) -> HostPolicy:
    """The Host policy of a server bound to `host` (or to every interface with bind_all)."""
    names = parse_allowed(allowed)
    loopback = not bind_all and is_loopback_address(host)
    return HostPolicy(restricted=loopback or bool(names), allowed=names, flag=flag)


def split_host(value: str) -> tuple[str, int | None]:
    """('name', port) of a Host header or netloc: lower case, brackets and trailing dot removed."""
    value = (value or "").strip().lower()
    port = None
    if value.startswith("["):
        end = value.find("]")
        name, rest = (value[1:end], value[end + 1 :]) if end > 0 else (value, "")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
    else:
        name, sep, tail = value.rpartition(":")
        if sep and tail.isdigit() and ":" not in name:
            port = int(tail)
        else:
            name = value
    return name.rstrip("."), port


def host_allowed(host_header: str | None, policy: HostPolicy) -> bool:
    """Whether a request naming the server `host_header` is served under the policy."""
    if not policy.restricted or not host_header:
        return True  # no Host: not a browser (HTTP/1.0 tools), which DNS rebinding needs
    name, _ = split_host(host_header)
    return _ip(name) is not None or is_loopback_name(name) or name in policy.allowed


def same_origin(url: str, host_header: str | None) -> bool:
    """Whether the page URL (an Origin or Referer) has the host and port the request was sent to."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or not host_header:
        return False
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        return False
    name, host_port = split_host(host_header)
    return split_host(parts.hostname)[0] == name and port == (host_port or DEFAULT_PORTS[parts.scheme])


def refusal(method: str, headers, mimetype: str, policy: HostPolicy) -> str | None:
    """Why a request must be refused (403), or None. `headers` is a mapping with case-insensitive `get`."""
    host = headers.get("Host")
    if not host_allowed(host, policy):
        return (
            f"host '{split_host(host)[0][:100]}' is not served: use localhost or an IP address, or start "
            f"the server with {policy.flag}=NAME"
        )
    if method.upper() in SAFE_METHODS:
        return None
    if not headers.get(REQUEST_HEADER):
        return f"cross-site request refused: {method} requests need the {REQUEST_HEADER} header"
    if mimetype != "application/json":
        return f"cross-site request refused: {method} requests need Content-Type: application/json"
    origin = headers.get("Origin")
    if origin is not None:
        if not same_origin(origin, host):
            return f"cross-site request refused: Origin '{origin[:100]}' is not this server"
    else:
        referer = headers.get("Referer")
        if referer is not None and not same_origin(referer, host):
            return "cross-site request refused: Referer is not this server"
    return None


def check_request(request, policy: HostPolicy) -> str | None:
    """refusal() for a werkzeug Request."""
    return refusal(request.method, request.headers, request.mimetype, policy)


def too_large(announced: int | None = None) -> str:
    """The one-line reason of a 413 for a request body (`announced`: its Content-Length, if it had one)."""
    said = f"{announced} bytes announced, " if announced is not None else ""
    return f"request body too large: {said}at most {MAX_BODY} bytes accepted"


def body_refusal(content_length: int | None) -> str | None:
    """Why a request announcing this `Content-Length` must be refused (413) before its body is read, or None."""
    return too_large(content_length) if content_length is not None and content_length > MAX_BODY else None


def screen(request, policy: HostPolicy) -> tuple[int, str] | None:
    """(status, one-line reason) of a werkzeug Request refused before routing (403, 413), or None. Reads no
    body: the servers call it first, whatever the route."""
    reason = check_request(request, policy)
    if reason:
        return 403, reason
    reason = body_refusal(request.content_length)
    return (413, reason) if reason else None


def read_body(request) -> bytes | None:
    """A werkzeug Request's body, or None when it is longer than MAX_BODY: a chunked body (no
    `Content-Length`) is read only up to the limit, never to its end."""
    if body_refusal(request.content_length):
        return None
    stream, parts, size = request.stream, [], 0
    while size <= MAX_BODY:
        part = stream.read(MAX_BODY + 1 - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return None if size > MAX_BODY else b"".join(parts)
