"""A claim on a piece of work that holds across machines: a create-exclusive file with its holder and a heartbeat.

``flock`` (``plumbing.files.hold_directory``) keeps two processes of one machine off a run directory, but is not to
be trusted on a shared filesystem between machines. A ``Claim`` is a file created with ``O_CREAT | O_EXCL`` (atomic
on NFS v3+ and every local filesystem) that holds the holder's host, pid and a heartbeat (wall-clock seconds),
refreshed every ``HEARTBEAT_S`` by a thread while the work runs. A claim whose heartbeat is older than ``STALE_S``
(its holder died or lost the filesystem) may be broken, once, by whoever wants the work. Knows nothing of runs,
sweeps or the coordinator.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

HEARTBEAT_S = 30.0
STALE_S = 300.0


class ClaimHeld(Exception):
    """Someone else holds the claim (a live heartbeat): its holder, in words."""


def _holder() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time()}


def read_claim(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class Claim:
    """Take with ``Claim.take(path)``; ``release()`` (or a ``with`` block) gives it back."""

    def __init__(self, path: Path, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.path = path
        self.heartbeat_s = heartbeat_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.beat, daemon=True, name=f"claim-{path.name}")

    @classmethod
    def take(cls, path: str | os.PathLike[str], stale_s: float = STALE_S, heartbeat_s: float = HEARTBEAT_S) -> Claim:
        """The claim on ``path``, breaking a stale one; ClaimHeld when a live holder has it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held = read_claim(path)
                age = time.time() - float(held.get("heartbeat", 0)) if held else float("inf")
                if attempt == 0 and age > stale_s:
                    path.unlink(missing_ok=True)  # its holder stopped beating: the claim is broken
                    continue
                who = f"{held.get('host')} pid {held.get('pid')}, heartbeat {age:.0f} s ago" if held else "unknown"
                raise ClaimHeld(f"{path} is claimed by {who}") from None
            with os.fdopen(fd, "w") as handle:
                json.dump(_holder(), handle)
            claim = cls(path, heartbeat_s)
            claim.thread.start()
            return claim
        raise ClaimHeld(f"{path} was claimed again while its stale claim was broken")

    def beat(self) -> None:
        while not self.stopped.wait(self.heartbeat_s):
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            try:
                temporary.write_text(json.dumps(_holder()))
                os.replace(temporary, self.path)
            except OSError:
                continue

    def release(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
