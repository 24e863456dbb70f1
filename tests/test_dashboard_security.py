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
    handler_for,
    host_name,
    is_loopback,
    make_server,
    write_token,
)


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
    (tmp_path / "secret.txt").write_text("the operator's secret\n")
    (run / "leak.json").symlink_to(tmp_path / "secret.txt")
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
    server = Server(("127.0.0.1", 0), handler_for(Dashboard(tree, token, {"127.0.0.1", "localhost"})))
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
    assert status == 200 and [r["id"] for r in json.loads(body)["runs"]] == ["run-a"]
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
    _, _, body = request(loopback, "/api/run?id=run-a")
    assert b"operator's secret" not in body


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "", "attacker"])
def test_a_wrong_host_is_refused(loopback: int, host: str) -> None:
    for path in ("/", "/api/runs", "/static/dashboard.js"):
        status, _, body = request(loopback, path, headers={"Host": host})
        assert status == 403 and b"run-a" not in body


def test_localhost_names_are_accepted() -> None:
    assert host_name("localhost:8080") == "localhost" and host_name("[::1]:80") == "::1"
    assert host_name("127.0.0.1") == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and not is_loopback("0.0.0.0")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_only_get_and_head_are_answered_and_no_cors_header_is_sent(loopback: int, method: str) -> None:
    status, headers, _ = request(loopback, "/api/runs", method=method,
                                 headers={"Origin": "http://evil.example", "Content-Length": "0"})
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert not any(name.startswith("access-control") for name in headers)


def test_off_loopback_every_request_needs_the_token(guarded: tuple[int, str]) -> None:
    port, token = guarded
    for path in ("/", "/api/runs", "/api/run?id=run-a", "/static/dashboard.js"):
        assert request(port, path)[0] == 401
        assert request(port, path, headers={"Cookie": "fedge_dashboard=" + "x" * len(token)})[0] == 401
        assert request(port, path + ("&" if "?" in path else "?") + "token=wrong")[0] == 401
    status, headers, _ = request(port, f"/?token={token}")  # the printed URL: a cookie, then the page
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"fedge_dashboard={token};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, _, body = request(port, "/api/runs", headers={"Cookie": f"other=1; fedge_dashboard={token}"})
    assert status == 200 and b"run-a" in body
    assert request(port, "/api/runs", headers={"Cookie": f"fedge_dashboard={token}", "Host": "evil.example"})[0] == 403


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
