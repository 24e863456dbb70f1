"""The dashboard's HTTP server: the page, its static files and two JSON answers, behind the security rules.

    coordinator dashboard runs/ --listen 127.0.0.1:0              # loopback: no token; the first line is the URL
    coordinator dashboard runs/ --listen 0.0.0.0:8080             # elsewhere: a token, printed once in the URL

Routes (GET and HEAD only; anything else is 405): ``/`` the page, ``/static/NAME`` one of the files of
``static/`` (a fixed list read at start: no path from a request ever reaches the file system), ``/api/runs?page=P``
the run list (paged), ``/api/run?id=ID&since=N&generation=G&agents=KEY`` one run (``runs.RunView.detail``). Every request's
Host header must name this server (127.0.0.1, localhost, the bound name, or with a non-loopback bind one of this
machine's names and addresses): that defeats DNS rebinding. Off loopback every request needs the token, from the
URL once (then kept in an HttpOnly, SameSite=Strict cookie) or from that cookie, compared in constant time; the
token file (mode 0600) must lie outside the served tree. No CORS header is ever sent. The standard library
(``ThreadingHTTPServer``) and ``plumbing.net``'s loopback rule; reads run directories and never writes to them.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fedge.dashboard.runs import RunView, find_runs
from fedge.plumbing.net import is_loopback_host

log = logging.getLogger("fedge.dashboard")

STATIC_DIR = Path(__file__).parent / "static"
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".json": "application/json", ".png": "image/png"}
COOKIE = "fedge_dashboard_"  # then the port: cookies are not kept apart by port, two dashboards' tokens are
LOGIN_PAGE = (b'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=/">'
              b'<title>Fedge dashboard</title><a href="/">open the dashboard</a>\n')
RUNS_PER_PAGE = 50
RESCAN_S = 2.0  # the run list is looked for again at most this often
RESCAN_MISSED_S = 0.25  # or this often, when a page asks for a run not found yet
VIEWS_KEPT = 200  # runs whose followed files are kept in memory (the least recently asked for go first)
REQUEST_TIMEOUT_S = 30  # an idle or slow connection is closed after this long
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
DEFAULT_TOKEN_FILE = Path("~/.config/fedge/dashboard.token")
HEADERS = {"Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:",
           "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:PORT') -> (host, port); ValueError in one line otherwise."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:8080 (port 0 picks a free one)")
    return host.strip("[]"), int(port)


def machine_names(host: str) -> set[str]:
    """The Host names a page may be reached by: loopback, the bound name, and for a wildcard bind this machine's
    names and addresses."""
    names = {*LOOPBACK_NAMES, host}
    if host in ("0.0.0.0", "::", ""):
        import psutil

        names |= {socket.gethostname(), socket.getfqdn()}
        names |= {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
                  if a.family in (socket.AF_INET, socket.AF_INET6)}
    return {n.lower() for n in names if n}


def host_name(header: str) -> str:
    """The name of a Host header without its port ('[::1]:80' -> '::1'); '' when it is not NAME[:PORT]."""
    header = header.strip().lower()
    if header.startswith("["):
        name, _, rest = header[1:].partition("]")
        return name if rest == "" or (rest.startswith(":") and rest[1:].isdigit()) else ""
    name, colon, port = header.partition(":")
    return name if not colon or port.isdigit() else ""


def token_path(path: Path, served: Path) -> Path:
    """The token file's absolute path, refused (ValueError) inside the served tree."""
    path = path.expanduser().absolute()
    if path.resolve().is_relative_to(served.resolve()):
        raise ValueError(f"--token-file {path} lies inside the served directory {served}: put it elsewhere")
    return path


def write_token(path: Path, served: Path) -> str:
    """A new token, written to ``path`` (mode 0600, set before anything is written; a link there is refused),
    which must lie outside the served tree."""
    path = token_path(path, served)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(fd, 0o600)
        handle.truncate(0)
        handle.write(token + "\n")
    return token


class Dashboard:
    """What the handler serves: the runs under ``root``, the static files, the token and the allowed Host names."""

    def __init__(self, root: Path, token: str | None, hosts: set[str]) -> None:
        check_root(root)
        self.root = root.resolve()
        self.token = token
        self.hosts = hosts
        self.cookie = COOKIE  # the port is added once bound
        self.static = {p.name: p.read_bytes() for p in sorted(STATIC_DIR.iterdir())
                       if p.is_file() and p.suffix in STATIC_TYPES}
        self.lock = threading.Lock()
        self.found: dict[str, Path] = {}
        self.found_at = -RESCAN_S
        self.views: dict[str, RunView] = {}

    def runs(self, within_s: float = RESCAN_S) -> dict[str, Path]:
        if time.monotonic() - self.found_at >= within_s:
            self.found, self.found_at = find_runs(self.root), time.monotonic()
        return self.found

    def view(self, run_id: str) -> RunView | None:
        path = self.runs().get(run_id) or self.runs(RESCAN_MISSED_S).get(run_id)  # a run that just appeared
        if path is None:
            return None
        view = self.views.pop(run_id, None)
        if view is None or view.path != path:
            view = RunView(run_id, path, self.root)
        self.views[run_id] = view  # the most recently used last
        while len(self.views) > VIEWS_KEPT:
            self.views.pop(next(iter(self.views)))
        return view if view.in_place() else None

    def run_list(self, page: int) -> dict[str, Any]:
        runs = list(self.runs())
        pages = max(1, -(-len(runs) // RUNS_PER_PAGE))
        page = min(max(page, 1), pages)
        shown = runs[(page - 1) * RUNS_PER_PAGE:page * RUNS_PER_PAGE]
        return {"root": str(self.root), "total": len(runs), "page": page, "pages": pages,
                "runs": [view.summary() for view in (self.view(i) for i in shown) if view is not None]}

    def run_detail(self, run_id: str, since: int, generation: int, agents_key: str) -> dict[str, Any] | None:
        view = self.view(run_id)
        return None if view is None else view.detail(since, generation, agents_key)


def check_root(root: Path) -> None:
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory: give a runs directory or a run directory")


def handler_for(dashboard: Dashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "fedge-dashboard"
        sys_version = ""
        timeout = REQUEST_TIMEOUT_S

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("%s %s", self.address_string(), format % args)

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            self.answer(head=False)

        def do_HEAD(self) -> None:  # noqa: N802
            self.answer(head=True)

        def refuse_method(self) -> None:
            self.reply(405, b"only GET and HEAD\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = refuse_method  # noqa: N815

        def reply(self, code: int, body: bytes, kind: str, extra: dict[str, str] | None = None,
                  head: bool = False) -> None:
            self.send_response(code)
            for name, value in {**HEADERS, "Content-Type": kind, "Content-Length": str(len(body)),
                                "Cache-Control": "no-store", **(extra or {})}.items():
                self.send_header(name, value)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def plain(self, code: int, text: str, head: bool) -> None:
            self.reply(code, (text + "\n").encode(), "text/plain; charset=utf-8", head=head)

        def authorised(self, query: dict[str, list[str]], head: bool) -> bool:
            hosts = self.headers.get_all("Host") or []
            if len(hosts) != 1 or host_name(hosts[0]) not in dashboard.hosts:
                self.plain(403, "this dashboard is not served under that Host name", head)
                return False
            if dashboard.token is None:
                return True
            given = query.get("token", [""])[0]
            if given and hmac.compare_digest(given.encode(), dashboard.token.encode()):
                # a page, not a redirect: a link followed from another site would carry no SameSite=Strict cookie
                # into the redirected request; this page's own refresh to / is same-site
                self.reply(200, LOGIN_PAGE, STATIC_TYPES[".html"], {
                    "Set-Cookie": f"{dashboard.cookie}={dashboard.token}; HttpOnly; SameSite=Strict; Path=/"}, head)
                return False
            for part in self.headers.get("Cookie", "").split(";"):
                name, _, value = part.strip().partition("=")
                if name == dashboard.cookie and hmac.compare_digest(value.encode(), dashboard.token.encode()):
                    return True
            self.plain(401, "this dashboard needs its token: open the URL it printed at start (the token file "
                       "holds it too)", head)
            return False

        def answer(self, head: bool) -> None:
            if not self.path.startswith("/") or self.path.startswith("//"):  # absolute-form targets, or //host
                self.plain(400, "bad request target", head)
                return
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if not self.authorised(query, head):
                return
            try:
                if url.path in ("/", "/index.html"):
                    self.reply(200, dashboard.static["index.html"], STATIC_TYPES[".html"], head=head)
                elif url.path.startswith("/static/") and url.path[len("/static/"):] in dashboard.static:
                    name = url.path[len("/static/"):]
                    self.reply(200, dashboard.static[name], STATIC_TYPES[Path(name).suffix], head=head)
                elif url.path == "/api/runs":
                    with dashboard.lock:
                        found = dashboard.run_list(number(query, "page", 1))
                    self.json(found, head)
                elif url.path == "/api/run":
                    with dashboard.lock:
                        detail = dashboard.run_detail(query.get("id", [""])[0], number(query, "since", 0),
                                                      number(query, "generation", -1), query.get("agents", [""])[0])
                    if detail is None:
                        self.plain(404, "no such run under this dashboard's directory", head)
                    else:
                        self.json(detail, head)
                else:
                    self.plain(404, "not found", head)
            except (BrokenPipeError, ConnectionResetError):
                pass
            except Exception:  # a bug, or a file shaped like nothing expected: one line in the log, a 500, serving on
                log.exception("dashboard: %s failed", url.path)
                self.plain(500, "the dashboard could not answer this request (its log says why)", head)

        def json(self, value: Any, head: bool) -> None:
            self.reply(200, json.dumps(value, allow_nan=False, default=str).encode(), "application/json", head=head)

    return Handler


def number(query: dict[str, list[str]], key: str, default: int) -> int:
    value = query.get(key, [""])[0]
    return int(value) if re.fullmatch(r"-?[0-9]{1,11}", value) else default


class Server(ThreadingHTTPServer):
    daemon_threads = True


class IPv6Server(Server):
    address_family = socket.AF_INET6


def bind(dashboard: Dashboard, host: str, port: int) -> Server:
    """A server for ``dashboard`` bound at (host, port); the token's cookie is named after the bound port."""
    server = (IPv6Server if ":" in host else Server)((host, port), handler_for(dashboard))
    dashboard.cookie = f"{COOKIE}{server.server_address[1]}"
    return server


def make_server(root: Path, listen: str, token_file: Path | None = None) -> tuple[Server, str]:
    """A bound server and the URL to print (with the token off loopback); serve with ``serve_forever()``."""
    host, port = parse_listen(listen)
    check_root(root)
    tokens = None if is_loopback_host(host) else token_path(token_file or DEFAULT_TOKEN_FILE, root)
    dashboard = Dashboard(root, None, machine_names(host))
    server = bind(dashboard, host, port)
    bound = server.server_address[1]
    token = dashboard.token = write_token(tokens, root) if tokens is not None else None  # once bound: nothing
    # is written by a start that fails
    shown = host if host not in ("0.0.0.0", "::") else socket.gethostname()
    shown = f"[{shown}]" if ":" in shown else shown
    return server, f"http://{shown}:{bound}/" + (f"?token={token}" if token else "")
