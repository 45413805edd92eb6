"""The dataset field as untrusted input (issue 15): the address classifier, URL hops and redirects, local paths,
and dataset bytes that are not Unicode. Real HTTP servers on loopback; the only stand-in is a resolver wrapper in
the rebinding test, which counts name lookups and answers differently the second time."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benchwright.data.dataset_access import (
    DatasetAccess,
    LocalPathRules,
    _open_no_follow,
    check_local_path,
    open_source,
)
from benchwright.data.datasets import analyze_dataset, fetch_dataset
from benchwright.errors import DatasetError, InvalidInput
from benchwright.proxy.addresses import (
    endpoint_allowed,
    internal_reason,
    parse_endpoints,
)
from benchwright.proxy.policy import HostPolicy, HostRule

ROWS = b'{"question": "1+1", "answer": "2"}\n'


@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("::ffff:127.0.0.1", "loopback (as 127.0.0.1)"), ("::127.0.0.1", "loopback (as 127.0.0.1)"),
    ("2002:7f00:1::", "loopback (as 127.0.0.1)"), ("64:ff9b::a9fe:a9fe", "link-local (as 169.254.169.254)"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fc00::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"), ("::ffff:169.254.169.254",
                                                                       "link-local (as 169.254.169.254)"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("240.0.0.1", "reserved"), ("100.100.100.200", "not publicly routable"), ("192.0.2.7", "private"),
    ("8.8.8.8", None), ("1.1.1.1", None), ("2001:4860:4860::8888", None), ("::ffff:8.8.8.8", None),
])
def test_internal_reason_classifies_every_platform_range(address: str, reason: str | None) -> None:
    assert internal_reason(address) == reason


def test_operator_endpoints_parse_and_match_by_name_or_address() -> None:
    allowed = parse_endpoints(["127.0.0.1:8080", "mirror.internal:3141", "[::1]:9000"])
    assert allowed == {("127.0.0.1", 8080), ("mirror.internal", 3141), ("::1", 9000)}
    assert endpoint_allowed(allowed, host="localhost", address="127.0.0.1", port=8080)
    assert endpoint_allowed(allowed, host="[::1]", address="::1", port=9000)
    assert not endpoint_allowed(allowed, host="127.0.0.1", address="127.0.0.1", port=8081)
    for bad in ("127.0.0.1", "host:", "host:http", "host:70000"):
        with pytest.raises(ValueError, match="must be host:port"):
            parse_endpoints([bad])


# ---------------------------------------------------------------------------------------------- loopback servers


class _Server:
    """A threaded HTTP server on loopback; ``routes`` maps a path to a handler writing the answer."""

    def __init__(self, routes: dict[str, Callable[[http.server.BaseHTTPRequestHandler], None]]) -> None:
        self.requests: list[tuple[str, str | None]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append((self.path, self.headers.get("Host")))
                routes.get(self.path, _status(404))(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _status(code: int, body: bytes = b"", headers: dict[str, str] | None = None
            ) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return answer


def _redirect(location: str) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    return _status(302, headers={"Location": location})


@pytest.fixture
def servers() -> Iterator[Callable[..., _Server]]:
    made: list[_Server] = []

    def make(routes: dict[str, Callable[[http.server.BaseHTTPRequestHandler], None]]) -> _Server:
        made.append(_Server(routes))
        return made[-1]
    yield make
    for server in made:
        server.close()


def _fetch(source: str, access: DatasetAccess) -> tuple[bytes | DatasetError, list[str]]:
    refused: list[str] = []
    try:
        return b"".join(open_source(source, access, refused.append)), refused
    except DatasetError as exc:
        return exc, refused


def _allowing(*servers: _Server, **kw: Any) -> DatasetAccess:
    return DatasetAccess(internal_allowed=frozenset(("127.0.0.1", s.port) for s in servers), **kw)


def test_loopback_is_refused_unless_the_operator_listed_the_endpoint(servers: Callable[..., _Server]) -> None:
    origin = servers({"/d.jsonl": _status(200, ROWS)})
    err, refused = _fetch(origin.url("/d.jsonl"), DatasetAccess())
    assert isinstance(err, DatasetError) and err.code == "dataset_blocked"
    assert "127.0.0.1" in err.message and "internal address" in err.message and "loopback" in err.message
    assert refused == ["127.0.0.1"] and origin.requests == [], "refused before a byte was sent"
    # A name and an IPv4-mapped literal for the same address are refused alike (the policy allows everything).
    assert isinstance(_fetch(origin.url("/d.jsonl", host="localhost"), DatasetAccess())[0], DatasetError)
    assert _fetch(origin.url("/d.jsonl", host="[::ffff:127.0.0.1]"), DatasetAccess())[1] == ["127.0.0.1"]
    assert _fetch(origin.url("/d.jsonl"), _allowing(origin)) == (ROWS, [])


def test_metadata_address_and_odd_schemes_are_refused_without_connecting() -> None:
    err, refused = _fetch("http://169.254.169.254/latest/meta-data/iam/", DatasetAccess())
    assert isinstance(err, DatasetError) and "link-local" in err.message and refused == ["169.254.169.254"]
    err, refused = _fetch("http://127.1/x.csv", DatasetAccess())
    assert isinstance(err, DatasetError) and "invalid host" in err.message and refused == ["127.1"]
    with pytest.raises(DatasetError, match="unsupported dataset scheme"):
        list(open_source("file:///etc/passwd", DatasetAccess()))


def test_every_redirect_hop_is_checked_again(servers: Callable[..., _Server]) -> None:
    inside = servers({"/secret": _status(200, b"internal only")})
    origin = servers({
        "/to-internal": _redirect(inside.url("/secret")),
        "/to-blocked": _redirect("http://blocked.example/d.jsonl"),
        "/to-file": _redirect("file:///etc/passwd"),
        "/loop": _redirect("/loop"),
        "/hop": _redirect("/d.jsonl"),
        "/d.jsonl": _status(200, ROWS),
    })
    policy = HostPolicy(rules=[HostRule(pattern="blocked.example", action="block")])
    access = _allowing(origin, policy=policy)
    err, refused = _fetch(origin.url("/to-internal"), access)
    assert isinstance(err, DatasetError) and "internal address" in err.message and refused == ["127.0.0.1"]
    assert inside.requests == [], "the redirect target on an internal address was never contacted"
    err, refused = _fetch(origin.url("/to-blocked"), access)
    assert isinstance(err, DatasetError) and refused == ["blocked.example"]
    assert "blocked by the account's host policy" in err.message and "'blocked.example'" in err.message
    err, _ = _fetch(origin.url("/to-file"), access)
    assert isinstance(err, DatasetError) and "scheme 'file'" in err.message
    err, _ = _fetch(origin.url("/loop"), access)
    assert isinstance(err, DatasetError) and "more than 5 redirects" in err.message
    assert [p for p, _ in origin.requests].count("/loop") == 6
    assert _fetch(origin.url("/hop"), access) == (ROWS, [])


def test_the_connection_goes_to_the_checked_address(servers: Callable[..., _Server],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: the name is looked up once per hop; a second answer (here: an address that refuses
    connections) would only be used if the client resolved the name again when connecting."""
    origin = servers({"/d.jsonl": _status(200, ROWS)})
    real = socket.getaddrinfo
    lookups: list[str] = []

    def resolver(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.test":
            lookups.append(host)
            address = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"
            return real(address, port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    access = DatasetAccess(internal_allowed=frozenset({("rebind.test", origin.port)}))
    assert _fetch(f"http://rebind.test:{origin.port}/d.jsonl", access) == (ROWS, [])
    assert lookups == ["rebind.test"] and origin.requests == [("/d.jsonl", f"rebind.test:{origin.port}")]


def test_a_slow_download_stops_at_the_total_time_bound(servers: Callable[..., _Server]) -> None:
    def trickle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.end_headers()
        try:
            for _ in range(100):
                h.wfile.write(b"x" * 1000)
                h.wfile.flush()
                time.sleep(0.05)  # the server's pace, not test synchronization
        except OSError:
            pass

    origin = servers({"/slow": trickle})
    started = time.monotonic()
    with pytest.raises(DatasetError, match="took longer than") as err:
        list(open_source(origin.url("/slow"), _allowing(origin, total_timeout_s=0.3)))
    assert err.value.code == "fetch_timeout" and time.monotonic() - started < 2.0


# --------------------------------------------------------------------------------------------------- local paths


def _rules(data_dir: Path, **kw: Any) -> LocalPathRules:
    return LocalPathRules(deployment=True, account=True, protected=(data_dir,), **kw)


def test_local_paths_need_the_deployment_and_the_account(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_bytes(ROWS)
    for rules, fragment in ((LocalPathRules(account=True), "this deployment"),
                            (LocalPathRules(deployment=True), "this account")):
        with pytest.raises(InvalidInput, match=fragment) as err:
            check_local_path(str(tmp_path / "d.jsonl"), rules, must_exist=True)
        assert err.value.code == "local_paths_disabled"


def test_secret_places_are_refused_however_they_are_spelled(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "dev-account.json").write_text(json.dumps({"api_key": "bw_live"}))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "link.json").symlink_to(data_dir / "dev-account.json")
    rules = _rules(data_dir)
    for source in (str(data_dir / "dev-account.json"), str(outside / "link.json"),
                   str(outside / ".." / "data" / "benchwright.db"), "/etc/shadow", "/proc/self/environ",
                   "/sys/kernel/notes", "~/.ssh/id_rsa", "/root/.aws/credentials"):
        with pytest.raises(DatasetError) as err:
            check_local_path(source, rules, must_exist=False)
        assert err.value.code == "dataset_blocked" and "secrets" in err.value.message, source
    with pytest.raises(DatasetError, match="holds the platform's or the host's secrets"):
        list(open_source(str(outside / "link.json"), DatasetAccess(local=rules)))


def test_roots_and_regular_files(tmp_path: Path) -> None:
    root = tmp_path / "datasets"
    root.mkdir()
    (root / "d.jsonl").write_bytes(ROWS)
    (tmp_path / "elsewhere.jsonl").write_bytes(ROWS)
    rules = _rules(tmp_path / "data", roots=(root,))
    assert b"".join(open_source(str(root / "d.jsonl"), DatasetAccess(local=rules))) == ROWS
    with pytest.raises(DatasetError, match="outside the allowed dataset roots"):
        check_local_path(str(tmp_path / "elsewhere.jsonl"), rules, must_exist=True)
    with pytest.raises(DatasetError, match="not a regular file"):
        check_local_path(str(root), rules, must_exist=True)
    os.mkfifo(root / "pipe.jsonl")
    with pytest.raises(DatasetError, match="not a regular file"):
        list(open_source(str(root / "pipe.jsonl"), DatasetAccess(local=rules)))
    with pytest.raises(DatasetError, match="no dataset file") as err:
        check_local_path(str(root / "missing.jsonl"), rules, must_exist=True)
    assert err.value.code == "fetch_failed"


def test_a_symlink_swapped_in_after_the_check_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "d.jsonl").write_text("secret")
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "d.jsonl").write_bytes(ROWS)
    checked = check_local_path(str(tmp_path / "ok" / "d.jsonl"), _rules(tmp_path / "data"), must_exist=True)
    (tmp_path / "ok").rename(tmp_path / "ok-old")
    (tmp_path / "ok").symlink_to(tmp_path / "secret")  # a directory component becomes a symlink
    with pytest.raises(DatasetError, match="changed while it was being opened"):
        _open_no_follow(checked)
    (tmp_path / "ok").unlink()
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "d.jsonl").symlink_to(tmp_path / "secret" / "d.jsonl")  # the file itself
    with pytest.raises(DatasetError, match="changed while it was being opened"):
        _open_no_follow(checked)


def test_fetch_dataset_copies_an_allowed_url(servers: Callable[..., _Server], tmp_path: Path) -> None:
    origin = servers({"/d.jsonl": _status(200, ROWS)})
    fetched = fetch_dataset(source=origin.url("/d.jsonl"), dest_dir=tmp_path, access=_allowing(origin))
    assert fetched.path.read_bytes() == ROWS and fetched.bytes == len(ROWS) and fetched.format == "jsonl"


# ------------------------------------------------------------------------------------------------ not Unicode


@pytest.mark.parametrize("fmt, data, where", [
    ("jsonl", ROWS + ROWS + b'{"question": "\xff", "answer": "2"}\n', "line 3 is not UTF-8"),
    ("csv", b"question,answer\n1+1,2\n\xc3\x28,3\n", "line 3 is not UTF-8"),
    ("json", b'[{"question": "\xe2\x82", "answer": "2"}]', "the file is not UTF-8"),
    ("jsonl", ROWS + b'{"question": "\\ud800", "answer": "2"}\n', "row 2 holds text that is not valid Unicode"),
])
def test_bytes_that_are_not_unicode_are_a_dataset_error_naming_where(tmp_path: Path, fmt: str, data: bytes,
                                                                     where: str) -> None:
    source = tmp_path / f"d.{fmt}"
    source.write_bytes(data)
    with pytest.raises(DatasetError, match=where):
        analyze_dataset(source=source, fmt=fmt, tasks_path=tmp_path / "tasks.jsonl")
    assert not (tmp_path / "tasks.jsonl").exists()
