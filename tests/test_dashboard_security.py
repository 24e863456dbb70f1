"""The dashboard server as an attacker would try it: paths out of the tree (``..``, ``%2e%2e``, absolute paths,
links), a wrong Host (DNS rebinding), a missing or wrong token, methods other than GET and HEAD, CORS; and the
vendored chart library against its record. The shipped server on 127.0.0.1, an ephemeral port, in a thread."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedge.dashboard.server import (
    STATIC_DIR,
    Dashboard,
    Server,
    bind,
    host_name,
    make_server,
    write_token,
)
from fedge.plumbing.net import is_loopback_host as is_loopback


def serve(server: Server) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    run = root / "run-a"
    run.mkdir(parents=True)
    (run / "provenance.json").write_text(json.dumps({"started_at": "now"}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": 0.5, "bytes_down": 10}) + "\n")
    (tmp_path / "secret.txt").write_text('{"agents": [{"client_id": "the operator\'s secret"}]}\n')
    for name in ("leak.json", "status.json", "agents.json", "report.json", "clients.jsonl"):
        (run / name).symlink_to(tmp_path / "secret.txt")
    odd = root / "odd"  # a foreign directory with provenance.json and files of every wrong shape
    odd.mkdir()
    (odd / "provenance.json").write_text("[1, 2, 3]")
    (odd / "status.json").write_text('{"agents": 5, "eta_s": NaN, "round": "x", "updated_at": Infinity}')
    (odd / "report.json").write_text("[" * 50_000)
    (odd / "metrics.jsonl").write_text('{"round": 1, "test_accuracy": NaN}\n' + "[" * 50_000 + "\n")
    return root


@pytest.fixture
def loopback(tree: Path) -> Iterator[int]:
    server, url = make_server(tree, "127.0.0.1:0")
    assert url == f"http://127.0.0.1:{server.server_address[1]}/"  # no token on loopback
    yield from serve(server)


@pytest.fixture
def guarded(tree: Path, tmp_path: Path) -> Iterator[tuple[int, str]]:
    """The handler as it runs off loopback (a token), bound to 127.0.0.1 for the test."""
    token = write_token(tmp_path / "config" / "dashboard.token", tree)
    server = bind(Dashboard(tree, token, {"127.0.0.1", "localhost"}), "127.0.0.1", 0)
    for port in serve(server):
        yield port, token


def request(port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None
            ) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in {"Host": f"127.0.0.1:{port}", **(headers or {})}.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_the_page_the_run_list_and_a_run_are_served(loopback: int) -> None:
    status, headers, body = request(loopback, "/")
    assert status == 200 and b"uplot.iife.min.js" in body and "access-control-allow-origin" not in headers
    status, _, body = request(loopback, "/api/runs")
    assert status == 200 and [r["id"] for r in json.loads(body)["runs"]] == ["odd", "run-a"]
    status, _, body = request(loopback, "/api/run?id=run-a&since=0")
    assert status == 200 and json.loads(body)["rows"][0]["test_accuracy"] == 0.5
    status, headers, body = request(loopback, "/static/uplot.iife.min.js", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 10_000


@pytest.mark.parametrize("path", [
    "/static/../server.py", "/static/..%2fserver.py", "/static/%2e%2e/server.py", "/static/%2e%2e%2fserver.py",
    "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "//etc/passwd", "/static//etc/passwd",
    "/static/%2fetc%2fpasswd", "/api/run?id=../secret.txt", "/api/run?id=%2e%2e", "/api/run?id=/etc",
    "/api/run?id=run-a/../..", "/api/run?id=run-a/leak.json", "/run-a/leak.json", "/runs/run-a/provenance.json",
])
def test_no_path_leads_out_of_the_served_files(loopback: int, path: str) -> None:
    status, _, body = request(loopback, path)
    assert status == 404, (path, status)
    assert b"root:" not in body and b"secret" not in body and b"import" not in body


def test_a_link_in_a_run_directory_is_never_read(loopback: int) -> None:
    status, _, body = request(loopback, "/api/run?id=run-a")
    assert status == 200 and b"operator's secret" not in body
    assert json.loads(body)["agents"] == [] and json.loads(body)["rows"][0]["round"] == 1


def test_files_of_every_wrong_shape_are_shown_as_absent_and_the_server_keeps_serving(loopback: int) -> None:
    status, _, body = request(loopback, "/api/run?id=odd")
    detail = json.loads(body)
    assert status == 200 and detail["rows"] == [{"round": 1, "test_accuracy": None}] and detail["agents"] == []
    assert detail["status"]["eta_s"] is None and detail["report"] == {} and detail["provenance"] == {}
    assert request(loopback, "/api/runs")[0] == 200


@pytest.mark.parametrize("query", ["since=%C2%B2", "since=--1", "since=99999999999999", "generation=1e9",
                                   "since=-5&generation=x"])
def test_odd_numbers_in_a_query_are_ignored(loopback: int, query: str) -> None:
    status, _, body = request(loopback, f"/api/run?id=run-a&{query}")
    assert status == 200 and json.loads(body)["id"] == "run-a"


def test_every_answer_carries_the_security_headers_and_head_has_no_body(loopback: int) -> None:
    for path, expected in (("/", 200), ("/api/runs", 200), ("/nothing", 404)):
        status, headers, body = request(loopback, path, method="HEAD")
        assert status == expected and body == b""
        assert headers["content-security-policy"].startswith("default-src 'self'")
        assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "no-referrer" and headers["cache-control"] == "no-store"


def test_the_server_writes_nothing_under_the_served_tree(loopback: int, tree: Path) -> None:
    before = {p: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in tree.rglob("*")}
    for path in ("/", "/api/runs", "/api/run?id=run-a", "/api/run?id=odd", "/static/dashboard.js"):
        request(loopback, path)
    assert {p: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in tree.rglob("*")} == before


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "", "attacker",
                                  "[::1]evil.example", "127.0.0.1:80x", "127.0.0.1:", "localhost.:80"])
def test_a_wrong_host_is_refused(loopback: int, host: str) -> None:
    for path in ("/", "/api/runs", "/static/dashboard.js"):
        status, _, body = request(loopback, path, headers={"Host": host})
        assert status == 403 and b"run-a" not in body


def test_a_second_host_header_or_an_absolute_target_is_refused(loopback: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", loopback, timeout=10)
    connection.putrequest("GET", "/api/runs", skip_host=True)
    connection.putheader("Host", "127.0.0.1")
    connection.putheader("Host", "evil.example")
    connection.endheaders()
    assert connection.getresponse().status == 403
    connection.close()
    assert request(loopback, "http://evil.example/api/runs")[0] == 400
    assert request(loopback, "//evil.example/api/runs")[0] == 404  # http.server reads it as /evil.example/...


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1234", "[::1]", "[::1]:8080", "127.0.0.1"])
def test_the_loopback_names_are_accepted(loopback: int, host: str) -> None:
    assert request(loopback, "/api/runs", headers={"Host": host})[0] == 200


def test_localhost_names_are_accepted() -> None:
    assert host_name("localhost:8080") == "localhost" and host_name("[::1]:80") == "::1"
    assert host_name("127.0.0.1") == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("127.3.2.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("127.attacker.example") and not is_loopback("::")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_only_get_and_head_are_answered_and_no_cors_header_is_sent(loopback: int, method: str) -> None:
    status, headers, _ = request(loopback, "/api/runs", method=method,
                                 headers={"Origin": "http://evil.example", "Content-Length": "0"})
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert not any(name.startswith("access-control") for name in headers)


def test_off_loopback_every_request_needs_the_token(guarded: tuple[int, str]) -> None:
    port, token = guarded
    cookie = f"fedge_dashboard_{port}"
    for path in ("/", "/api/runs", "/api/run?id=run-a", "/static/dashboard.js"):
        assert request(port, path)[0] == 401
        assert request(port, path, headers={"Cookie": f"{cookie}=" + "x" * len(token)})[0] == 401
        assert request(port, path, headers={"Cookie": f"fedge_dashboard_1={token}"})[0] == 401  # another port's
        assert request(port, path + ("&" if "?" in path else "?") + "token=wrong")[0] == 401
    # the printed URL: a page that sets the cookie and refreshes to / (same-site, so the cookie goes with it)
    status, headers, body = request(port, f"/api/runs?token={token}")
    assert status == 200 and b'http-equiv="refresh" content="0;url=/"' in body and b"run-a" not in body
    assert "location" not in headers
    set_cookie = headers["set-cookie"]
    assert set_cookie.startswith(f"{cookie}={token};") and "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    status, _, body = request(port, "/api/runs", headers={"Cookie": f"other=1; {cookie}={token}"})
    assert status == 200 and b"run-a" in body
    assert request(port, "/api/runs", headers={"Cookie": f"{cookie}={token}", "Host": "evil.example"})[0] == 403


def test_a_failed_start_writes_no_token_and_a_link_at_the_token_path_is_refused(tree: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "tokens" / "token"
    with pytest.raises(FileNotFoundError):
        make_server(tmp_path / "missing", "0.0.0.0:0", token_file)
    with pytest.raises(ValueError, match="inside the served directory"):
        make_server(tree, "0.0.0.0:0", tree / "token")
    with pytest.raises(OSError):
        make_server(tree, "host.invalid:0", token_file)  # off loopback (a token), but the bind fails
    assert not token_file.exists() and not (tree / "token").exists()
    (tmp_path / "elsewhere").write_text("")
    token_file.parent.mkdir()
    token_file.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        write_token(token_file, tree)
    assert (tmp_path / "elsewhere").read_text() == ""


def test_the_token_file_is_private_and_outside_the_served_tree(tree: Path, tmp_path: Path) -> None:
    path = tmp_path / "private" / "token"
    token = write_token(path, tree)
    assert path.read_text().strip() == token and len(token) >= 40
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(ValueError, match="inside the served directory"):
        write_token(tree / "run-a" / "token", tree)
    assert not (tree / "run-a" / "token").exists()


def test_the_vendored_chart_library_matches_its_record() -> None:
    record = json.loads((STATIC_DIR / "VENDOR.json").read_text())
    assert record["name"] == "uplot" and record["license"] == "MIT" and record["version"]
    for name, expected in record["files"].items():
        data = (STATIC_DIR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == expected["sha256"] and len(data) == expected["bytes"], name
    page = (STATIC_DIR / "index.html").read_text()
    assert "http://" not in page and "https://" not in page  # nothing from a CDN


def test_the_run_list_is_paged(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    for i in range(120):
        (root / f"cell-{i:03d}").mkdir(parents=True)
        (root / f"cell-{i:03d}" / "provenance.json").write_text("{}")
    server, _ = make_server(root, "127.0.0.1:0")
    for port in serve(server):
        pages = [json.loads(request(port, f"/api/runs?page={n}")[2]) for n in (1, 2, 3, 9)]
        assert [len(p["runs"]) for p in pages] == [50, 50, 20, 20] and {p["pages"] for p in pages} == {3}
        assert [r["id"] for p in pages[:3] for r in p["runs"]] == [f"cell-{i:03d}" for i in range(120)]
