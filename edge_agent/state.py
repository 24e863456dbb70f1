"""The device's own state on disk: what an algorithm's client half keeps between rounds, committed in two phases.

After a round the agent writes the client half's state as *pending* for that round; it becomes *committed* only when
the coordinator confirms that the round was checkpointed with this device's update in it (a Commit message, or a
later task whose ``last_accepted_round`` names the round). A pending state the coordinator never confirmed is
discarded, so a resumed coordinator never makes a device apply a round twice. Files are written atomically. Knows
nothing of sockets, torch or algorithms: it stores named numpy arrays.

Beside the client half's state, each round's file holds the model the device would answer predictions with (its
``model`` arrays and their ``model_meta``: the model spec, the normalisation, the run and round), so that what
``edge-agent predict`` uses is always the latest *committed* model, promoted in the same rename.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StoredState:
    run_id: str
    round: int
    arrays: dict[str, np.ndarray]
    model: dict[str, np.ndarray] = field(default_factory=dict)
    model_meta: dict[str, Any] = field(default_factory=dict)


class DirectoryLocked(OSError):
    """Another process holds the directory (a second coordinator on a run directory, a second agent on a state
    directory); the message names it."""


def hold_directory(directory: str | os.PathLike[str], what: str) -> Any:
    """Take the exclusive lock of ``directory`` (its ``.lock`` file, which records the holder's pid) for as long
    as the returned handle stays open; DirectoryLocked naming the holder when another process has it."""
    import fcntl

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    handle = open(path / ".lock", "a+")  # noqa: SIM115 - held open by the caller: the lock lives as long as it
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise DirectoryLocked(f"{path} is in use by another {what} (pid {holder}): stop it, or use another "
                              "directory") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX: the directory entry is data of the directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync it, rename it over the target, and fsync the
    directory so that the rename survives a power cut."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
    fsync_directory(path.parent)


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                model: Mapping[str, np.ndarray] | None = None) -> None:
    """Named arrays plus a JSON meta object in one .npz (``a/NAME``, ``m/NAME`` for ``model``, and ``meta``), written
    atomically, no pickle."""
    buffer = io.BytesIO()
    payload = {f"a/{k}": np.asarray(v) for k, v in arrays.items()}
    payload.update({f"m/{k}": np.asarray(v) for k, v in (model or {}).items()})
    payload["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(buffer, **payload)  # type: ignore[arg-type]
    atomic_write_bytes(path, buffer.getvalue())


def load_arrays(path: Path, prefix: str = "a/") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    arrays, meta, _ = load_arrays_and_model(path, prefix)
    return arrays, meta


def load_arrays_and_model(path: Path, prefix: str = "a/", model_prefix: str | None = None) -> tuple[
        dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
    """The ``prefix`` arrays, the meta and (with ``model_prefix``) the model arrays, all from one open of the
    file, so that a file replaced meanwhile cannot pair one round's meta with another's model."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        arrays = {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}
        model = ({k[len(model_prefix):]: data[k] for k in data.files if k.startswith(model_prefix)}
                 if model_prefix else {})
    return arrays, meta, model


def _save(path: Path, state: StoredState) -> None:
    meta = {"run_id": state.run_id, "round": state.round, "model_meta": state.model_meta}
    save_arrays(path, state.arrays, meta, state.model)


def _load(path: Path, with_model: bool = False) -> StoredState | None:
    if not path.exists():
        return None
    arrays, meta, model = load_arrays_and_model(path, "a/", "m/" if with_model else None)
    return StoredState(run_id=str(meta["run_id"]), round=int(meta["round"]), arrays=arrays, model=model,
                       model_meta=dict(meta.get("model_meta") or {}))


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

    def write_pending(self, run_id: str, round_number: int, arrays: dict[str, np.ndarray],
                      model: dict[str, np.ndarray] | None = None, model_meta: dict[str, Any] | None = None) -> None:
        _save(self.pending_path, StoredState(run_id, round_number, arrays, dict(model or {}), dict(model_meta or {})))

    def committed_model(self) -> StoredState | None:
        """The latest committed state with its prediction model (of whatever run), or None before the first
        commit or when that state carries no model."""
        state = _load(self.committed_path, with_model=True)
        return state if state is not None and state.model else None

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
