"""The quarantine's files in a run directory: ``quarantine.json`` (written by the session: the devices no longer
selected, why and since which round, and every device's streak) and ``quarantine.d/`` (an operator's requests:
one file ``clear-CLIENT_ID`` per device to let back, made by ``coordinator quarantine RUN_DIR --clear``, taken and
removed by the session at its next round start). One writer per file, so neither side can lose the other's
change. Knows nothing of the protocol or of sockets.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

QUARANTINE_FILE = "quarantine.json"
REQUESTS_DIR = "quarantine.d"
CLIENT_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def read_quarantine(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / QUARANTINE_FILE
    return json.loads(path.read_text()) if path.exists() else {"after": 0, "streaks": {}, "quarantined": {}}


def request_clear(run_dir: str | Path, client_id: str) -> Path:
    """Ask the session to let ``client_id`` back at its next round start."""
    if not CLIENT_ID.match(client_id):
        raise ValueError(f"{client_id!r} is not a client id (letters, digits, '.', '_', '-')")
    requests = Path(run_dir) / REQUESTS_DIR
    requests.mkdir(exist_ok=True)
    path = requests / f"clear-{client_id}"
    path.touch()
    return path


def take_clear_requests(run_dir: str | Path) -> list[str]:
    """The client ids asked to be let back, each request removed as it is taken."""
    requests = Path(run_dir) / REQUESTS_DIR
    if not requests.is_dir():
        return []
    taken = []
    for path in sorted(requests.glob("clear-*")):
        client_id = path.name[len("clear-"):]
        path.unlink(missing_ok=True)
        if CLIENT_ID.match(client_id):
            taken.append(client_id)
    return taken
