"""The device's own state on disk: what an algorithm's client half keeps between rounds, committed in two phases.

After a round the agent writes the client half's state as *pending* for that round; it becomes *committed* only when
the coordinator confirms that the round was checkpointed with this device's update in it (a Commit message, or a
later task whose ``last_accepted_round`` names the round). A pending state the coordinator never confirmed is
discarded, so a resumed coordinator never makes a device apply a round twice. Files are written atomically. Knows
nothing of sockets, torch or algorithms: it stores named numpy arrays.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class StoredState:
    run_id: str
    round: int
    arrays: dict[str, np.ndarray]


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _save(path: Path, state: StoredState) -> None:
    buffer = io.BytesIO()
    arrays = {f"a/{k}": v for k, v in state.arrays.items()}
    meta = json.dumps({"run_id": state.run_id, "round": state.round}).encode()
    np.savez(buffer, meta=np.frombuffer(meta, dtype=np.uint8), **arrays)  # type: ignore[arg-type]
    _write_atomic(path, buffer.getvalue())


def _load(path: Path) -> StoredState | None:
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        arrays = {k[2:]: data[k] for k in data.files if k.startswith("a/")}
    return StoredState(run_id=str(meta["run_id"]), round=int(meta["round"]), arrays=arrays)


class DeviceState:
    """committed.npz and pending.npz under the agent's state directory."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.committed_path = self.dir / "committed.npz"
        self.pending_path = self.dir / "pending.npz"

    def committed(self, run_id: str) -> dict[str, np.ndarray]:
        """The committed state of this run (empty for a new run: the state of another run is not reused)."""
        state = _load(self.committed_path)
        return dict(state.arrays) if state is not None and state.run_id == run_id else {}

    def write_pending(self, run_id: str, round_number: int, arrays: dict[str, np.ndarray]) -> None:
        _save(self.pending_path, StoredState(run_id, round_number, arrays))

    def confirm(self, run_id: str, accepted_round: int) -> bool:
        """Promote the pending state if it is this run's state of ``accepted_round``; drop it if it is older."""
        pending = _load(self.pending_path)
        if pending is None:
            return False
        if pending.run_id != run_id:
            self.pending_path.unlink(missing_ok=True)
            return False
        if pending.round == accepted_round:
            os.replace(self.pending_path, self.committed_path)
            return True
        if pending.round < accepted_round:
            self.pending_path.unlink(missing_ok=True)
        return False

    def discard_unconfirmed(self, run_id: str, last_accepted_round: int) -> None:
        """At the start of a round: keep nothing pending that the coordinator did not accept."""
        self.confirm(run_id, last_accepted_round)
        if self.pending_path.exists():
            self.pending_path.unlink()
