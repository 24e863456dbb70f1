"""Which runs a dashboard shows, and what it shows of each.

``find_runs`` lists the run directories under a root (a directory holding provenance.json, at most ``MAX_DEPTH``
levels down, symbolic links not followed, so nothing outside the root is ever read). ``RunView`` holds one run's
followed files (``runfiles.JsonlTail``) and answers the page's two questions: ``summary()`` (a line of the run
list) and ``detail(since, generation)`` (what the run page needs: the rows it does not have yet, or all of them
after the file was rewritten). Rows go out with their scalar fields only (lists such as ``accepted`` stay on disk),
the agent table holds at most ``AGENTS_SHOWN`` agents and the recent updates the last ``RECENT_UPDATES`` rows of
clients.jsonl. Reads files only; knows nothing of HTTP.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedge.dashboard.runfiles import JsonlTail, read_json

MAX_DEPTH = 3            # runs are found at most this many directory levels below the root
AGENTS_SHOWN = 2000      # agent-table rows sent to a page
RECENT_UPDATES = 50      # clients.jsonl rows shown as the latest updates
RUNNING_WITHIN_S = 60.0  # a run without report.json whose status.json is older than this is shown as not running
SKIP_DIRS = frozenset({"agents", "data", "keys", "quarantine.d", "__pycache__"})  # large, and never a run
UPDATE_FIELDS = ("round", "client_id", "available", "num_samples", "bytes_down", "bytes_up", "train_loss",
                 "train_s", "capped", "clipped", "unavailable_reason")


def find_runs(root: Path) -> dict[str, Path]:
    """Run id (its path relative to ``root``; "." for ``root`` itself) -> its directory, sorted by id."""
    found: dict[str, Path] = {}
    base = len(root.parts)
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        if "provenance.json" in files and not (here / "provenance.json").is_symlink():
            found[here.relative_to(root).as_posix()] = here
        if len(here.parts) - base >= MAX_DEPTH:
            dirs[:] = []
        else:
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
    return dict(sorted(found.items()))


def scalars(row: dict[str, Any]) -> dict[str, Any]:
    """A row's scalar fields, with NaN and infinities as null (JSON has neither)."""
    return {k: finite(v) for k, v in row.items() if v is None or isinstance(v, (int, float, str, bool))}


def finite(value: Any) -> Any:
    """``value`` with every non-finite float inside it replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (int, str, bool)) or value is None:
        return value
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


HEADLINES = ("test_accuracy", "test_exact_match", "test_label_accuracy", "test_mse", "test_mae")  # in this order


def headline(rows: Iterable[dict[str, Any]]) -> str | None:
    """The first figure of ``HEADLINES`` any row has (classification, multi-label, regression), as the console's."""
    present = {k for row in rows for k in HEADLINES if isinstance(row.get(k), (int, float))}
    return next((k for k in HEADLINES if k in present), None)


class RunView:
    """One run's files, followed as they grow; ``root``: the served tree, which the run must stay inside."""

    def __init__(self, run_id: str, path: Path, root: Path) -> None:
        self.run_id = run_id
        self.path = path
        self.root = root
        self.metrics = JsonlTail(path / "metrics.jsonl", shape=scalars)
        self.clients = JsonlTail(path / "clients.jsonl", keep=RECENT_UPDATES, start_within=1 << 20,
                                 shape=lambda row: {k: finite(row.get(k)) for k in UPDATE_FIELDS})
        self.agents_stamp: tuple[int, int, int] | None = None
        self.agents: dict[str, Any] = {}

    def in_place(self) -> bool:
        """The run directory is still a directory inside the served tree, not a link swapped in since it was
        found (the files in it are opened without following links; this covers the directory itself)."""
        try:
            return not self.path.is_symlink() and self.path.is_dir() and \
                Path(os.path.realpath(self.path)).is_relative_to(self.root)
        except OSError:
            return False

    def state(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(status.json, report.json, provenance.json), each {} when absent or not a JSON object."""
        return (read_json(self.path / "status.json") or {}, read_json(self.path / "report.json") or {},
                read_json(self.path / "provenance.json") or {})

    def agents_file(self) -> dict[str, Any]:
        """agents.json, read again only when it changed (it can hold thousands of agents)."""
        try:
            stat = os.stat(self.path / "agents.json", follow_symlinks=False)
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = None
        if stamp != self.agents_stamp:
            self.agents_stamp, self.agents = stamp, read_json(self.path / "agents.json") or {}
        return self.agents

    def summary(self, refresh: bool = True) -> dict[str, Any]:
        status, report, provenance = self.state()
        if refresh:
            self.metrics.refresh()
        last = self.metrics.rows[-1] if self.metrics.rows else {}
        shown = headline(self.metrics.rows)
        values = [r[shown] for r in self.metrics.rows if shown and isinstance(r.get(shown), (int, float))]
        return finite({"id": self.run_id, "name": self.path.name,
                       "algorithm": report.get("algorithm") or status.get("algorithm") or last.get("algorithm"),
                       "state": run_state(status, report), "round": status.get("round", last.get("round", 0)),
                       "rounds": report.get("rounds") or status.get("rounds"), "eta_s": status.get("eta_s"),
                       "headline": shown, "headline_value": values[-1] if values else None,
                       "started_at": provenance.get("started_at"), "updated_at": status.get("updated_at")})

    def detail(self, since: int, generation: int, agents_key: str = "") -> dict[str, Any]:
        """What the run page needs; ``since``: rows the page holds of ``generation`` (after another generation:
        every row again, with ``reset``); ``agents_key``: the agent table's key the page holds (the same key:
        ``agents`` is null, unchanged, which spares a page of a large fleet half a megabyte a second)."""
        status, report, provenance = self.state()
        self.metrics.refresh()
        self.clients.refresh()
        reset = generation != self.metrics.generation
        rows = self.metrics.since(0 if reset else since)
        listed = self.agents_file()
        listed_agents = isinstance(listed.get("agents"), list)
        agents = next((found for found in (listed.get("agents"), status.get("agents")) if isinstance(found, list)), [])
        key = repr(("agents.json", self.agents_stamp) if listed_agents else ("status.json", status.get("updated_at")))
        return finite({
            "id": self.run_id, "summary": self.summary(refresh=False), "generation": self.metrics.generation,
            "reset": reset, "rows_total": self.metrics.total, "rows": rows,
            "status": {k: v for k, v in status.items() if k != "agents"}, "report": report,
            "provenance": provenance,
            "agents": None if key == agents_key else [scalars(a) for a in agents[:AGENTS_SHOWN] if isinstance(a, dict)],
            "agents_key": key, "agents_total": len(agents), "agents_updated_at": listed.get("updated_at"),
            "updates": list(self.clients.rows),
            "privacy": report.get("privacy") or status.get("privacy"),
        })


def run_state(status: dict[str, Any], report: dict[str, Any], now: float | None = None) -> str:
    """report.json's status once written (done, stopped, budget, no-agents); before: running, or not running
    when status.json has not been written for ``RUNNING_WITHIN_S`` (a crash, or a coordinator gone)."""
    if report.get("status"):
        return str(report["status"])
    updated = status.get("updated_at")
    if not isinstance(updated, (int, float)):
        return "starting"
    return "running" if (now or time.time()) - float(updated) < RUNNING_WITHIN_S else "not running"
