"""The viewer's request checks (dlprof_plugin/security.py): Host names against DNS rebinding, what a
state-changing request needs against cross-site request forgery, and the request body's size. Over HTTP:
tests/test_hardening.py."""

import pytest

from dlprof_plugin.security import (
    MAX_BODY,
    REQUEST_HEADER,
    HostPolicy,
    body_refusal,
    host_allowed,
    is_loopback_address,
    parse_allowed,
    policy_for_bind,
    read_body,
    refusal,
    same_origin,
    screen,
    split_host,
)

LOOPBACK = policy_for_bind("127.0.0.1")


class Headers(dict):
    """Case-insensitive header mapping, as werkzeug's."""

    def get(self, name, default=None):
        return next((v for k, v in self.items() if k.lower() == name.lower()), default)


@pytest.mark.parametrize(
    "value,expected",
    [
        ("localhost:6006", ("localhost", 6006)),
        ("127.0.0.1", ("127.0.0.1", None)),
        ("[::1]:8000", ("::1", 8000)),
        ("[::1]", ("::1", None)),
        ("::1", ("::1", None)),
        ("LocalHost.:80", ("localhost", 80)),
        ("attacker.example:6006", ("attacker.example", 6006)),
        ("", ("", None)),
    ],
)
def test_split_host(value, expected):
    assert split_host(value) == expected


@pytest.mark.parametrize(
    "host,served",
    [
        ("localhost:6006", True),
        ("127.0.0.1:6006", True),
        ("127.8.9.10:6006", True),
        ("[::1]:6006", True),
        ("10.0.0.5:6006", True),
        ("[fe80::1]:6006", True),  # IP addresses cannot be rebound
        ("dlprof.localhost:6006", True),
        ("LOCALHOST.:6006", True),
        ("attacker.example:6006", False),
        ("localhost.attacker.example", False),
        ("127.0.0.1.nip.io", False),
        ("myproxy.example", False),
        (None, True),  # no Host: not a browser
    ],
)
def test_loopback_binding_serves_loopback_names_and_addresses_only(host, served):
    assert host_allowed(host, LOOPBACK) is served


def test_allowed_names_are_added_and_other_bindings_serve_any_name():
    policy = policy_for_bind("localhost", allowed="myproxy.example, Other.Example:443")
    assert policy.allowed == {"myproxy.example", "other.example"}
    assert host_allowed("myproxy.example:6006", policy) and host_allowed("OTHER.example", policy)
    assert not host_allowed("attacker.example", policy)
    assert host_allowed("attacker.example", policy_for_bind("0.0.0.0"))
    assert host_allowed("anything.example", policy_for_bind(None, bind_all=True))
    assert not host_allowed("anything.example", policy_for_bind("0.0.0.0", allowed=["myhost"]))
    assert parse_allowed(None) == frozenset() and parse_allowed(["a,b", "c"]) == {"a", "b", "c"}


@pytest.mark.parametrize(
    "host,loopback",
    [
        (None, True),
        ("localhost", True),
        ("127.0.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.7", False),
    ],
)
def test_which_bindings_are_loopback(host, loopback):
    assert is_loopback_address(host) is loopback


@pytest.mark.parametrize(
    "url,host,same",
    [
        ("http://127.0.0.1:6006", "127.0.0.1:6006", True),
        ("http://localhost", "localhost:80", True),
        ("https://viewer.example", "viewer.example", True),
        ("http://127.0.0.1:6006/#dlprof", "127.0.0.1:6006", True),
        ("http://127.0.0.1:6007", "127.0.0.1:6006", False),
        ("http://localhost:6006", "127.0.0.1:6006", False),
        ("https://127.0.0.1:6006", "127.0.0.1:6006", True),
        ("http://evil.example", "127.0.0.1:6006", False),
        ("null", "127.0.0.1:6006", False),
        ("file:///tmp/x.html", "127.0.0.1:6006", False),
        ("http://127.0.0.1:notaport", "127.0.0.1:6006", False),
        ("http://[::1]:6006", "[::1]:6006", True),
    ],
)
def test_same_origin(url, host, same):
    assert same_origin(url, host) is same


GOOD = {"Host": "127.0.0.1:6006", REQUEST_HEADER: "1", "Origin": "http://127.0.0.1:6006"}


@pytest.mark.parametrize(
    "case,method,headers,mimetype,refused",
    [
        ("the frontend's POST", "POST", GOOD, "application/json", None),
        ("a client without Origin", "POST", {"Host": "127.0.0.1:6006", REQUEST_HEADER: "1"}, "application/json", None),
        (
            "same-origin Referer",
            "POST",
            {"Host": "127.0.0.1:6006", REQUEST_HEADER: "1", "Referer": "http://127.0.0.1:6006/x"},
            "application/json",
            None,
        ),
        ("a GET from anywhere", "GET", {"Host": "localhost:6006", "Origin": "http://evil.example"}, "", None),
        (
            "form, text/plain",
            "POST",
            {"Host": "127.0.0.1:6006", "Origin": "http://evil.example"},
            "text/plain",
            "X-DLProf-Request",
        ),
        (
            "form, urlencoded",
            "POST",
            {"Host": "127.0.0.1:6006"},
            "application/x-www-form-urlencoded",
            "X-DLProf-Request",
        ),
        (
            "header but a form body",
            "POST",
            {"Host": "127.0.0.1:6006", REQUEST_HEADER: "1"},
            "text/plain",
            "application/json",
        ),
        ("foreign Origin", "POST", dict(GOOD, Origin="http://evil.example"), "application/json", "Origin"),
        ("Origin null", "POST", dict(GOOD, Origin="null"), "application/json", "Origin"),
        (
            "foreign Referer",
            "POST",
            {"Host": "127.0.0.1:6006", REQUEST_HEADER: "1", "Referer": "http://evil.example/page"},
            "application/json",
            "Referer",
        ),
        ("other methods too", "DELETE", {"Host": "127.0.0.1:6006"}, "", "X-DLProf-Request"),
        ("rebound host, GET", "GET", {"Host": "attacker.example:6006"}, "", "host 'attacker.example'"),
        (
            "rebound host, same origin",
            "POST",
            dict(GOOD, Host="attacker.example:6006", Origin="http://attacker.example:6006"),
            "application/json",
            "host",
        ),
    ],
)
def test_refusals(case, method, headers, mimetype, refused):
    reason = refusal(method, Headers(headers), mimetype, LOOPBACK)
    if refused is None:
        assert reason is None, case
    else:
        assert reason is not None and refused in reason and "\n" not in reason, (case, reason)


def test_the_refusal_names_the_flag_that_allows_a_name():
    policy = HostPolicy(restricted=True, flag="--dlprof_allowed_hosts")
    assert "--dlprof_allowed_hosts=NAME" in refusal("GET", Headers({"Host": "x.example"}), "", policy)


# ---------------------------------------------------------------------------- request bodies


class EndlessBody:
    """A request body that never ends (a chunked upload streaming forever); counts what was read."""

    def __init__(self):
        self.read_bytes = 0

    def read(self, n=-1):
        n = 1 << 20 if n is None or n < 0 else n
        self.read_bytes += n
        return b" " * n

    readline = read


def _request(body=b"", headers=None, stream=None):
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    env = EnvironBuilder(
        method="POST",
        path="/reaggregate",
        data=body,
        headers={"Host": "127.0.0.1:6006", REQUEST_HEADER: "1", **(headers or {})},
        content_type="application/json",
    ).get_environ()
    if stream is not None:  # a chunked body, as werkzeug's server hands it over: no length, a terminated stream
        env.pop("CONTENT_LENGTH", None)
        env["wsgi.input"] = stream
        env["wsgi.input_terminated"] = True
    return Request(env)


def test_a_body_within_the_limit_is_read_whole():
    body = b'{"run": "r"}' + b" " * (MAX_BODY - 12)
    assert len(body) == MAX_BODY
    assert read_body(_request(body)) == body
    assert screen(_request(body), LOOPBACK) is None


def test_an_announced_body_over_the_limit_is_refused_before_reading():
    stream = EndlessBody()
    request = _request(b"{}", stream=stream)
    request.environ["CONTENT_LENGTH"] = str(10**12)
    status, reason = screen(request, LOOPBACK)
    assert status == 413 and "1000000000000 bytes announced" in reason and f"at most {MAX_BODY}" in reason
    assert read_body(request) is None and stream.read_bytes == 0
    assert body_refusal(MAX_BODY) is None and body_refusal(None) is None and body_refusal(MAX_BODY + 1)


def test_a_chunked_body_is_read_only_up_to_the_limit():
    stream = EndlessBody()
    request = _request(stream=stream)
    assert screen(request, LOOPBACK) is None  # no length announced: cut while reading
    assert read_body(request) is None
    assert stream.read_bytes == MAX_BODY + 1


def test_the_host_check_comes_before_the_body_size():
    request = _request(b"{}", headers={"Host": "attacker.example"})
    request.environ["CONTENT_LENGTH"] = str(10**12)
    assert screen(request, LOOPBACK)[0] == 403
