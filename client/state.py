"""The device's own state on disk: what an algorithm's client half keeps between rounds, committed in two phases.

After a round the agent writes the client half's state as *pending* for that round; it becomes *committed* only when
the coordinator confirms that the round was checkpointed with this device's update in it (a Commit message, or a
later task whose ``last_accepted_round`` names the round). A pending state the coordinator never confirmed is
discarded, so a resumed coordinator never makes a device apply a round twice. Files are written atomically. Knows
nothing of sockets, torch or algorithms: it stores named numpy arrays.

A long-lived agent serves session after session. When a session other than the one in ``committed.npz`` commits
for the first time, the older session's committed state is moved (renamed, not rewritten) to
``sessions/RUN_ID.npz``, so that a session resumed later finds its device state again; the ``keep_sessions`` most
recent sessions are kept in all, the current one included, and older ones are removed.

Beside the client half's state, each round's file holds the model the device would answer predictions with (its
``model`` arrays and their ``model_meta``: the model spec, the normalisation, the run and round), so that what
``edge-agent predict`` uses is always the latest *committed* model, promoted in the same rename. A model array equal,
bit for bit, to one of the state's (ef's public replica is the model its device answers with) is stored once. The
state this process promoted is also kept in memory, and a round reads it from there while committed.npz is still the
file promoted (the random stamp each write puts in its meta); anything else is read from the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedge.plumbing import atomic_write_bytes, load_arrays_and_model, load_meta, replace_durably, save_arrays

# The prefix of a model's own arrays in a file where some of them are the state's (``model_aliases``): an agent
# from before such files reads no model there ("no committed model yet") rather than a model with arrays missing.
SHARING_MODEL = "n/"
MASKED_RUNS = 16  # the secure sessions whose last masked round a device remembers


@dataclass(frozen=True)
class StoredState:
    run_id: str
    round: int
    arrays: dict[str, np.ndarray]
    model: dict[str, np.ndarray] = field(default_factory=dict)
    model_meta: dict[str, Any] = field(default_factory=dict)


def _save(path: Path, state: StoredState, stamp: str = "") -> None:
    """A model array equal to one of the state's (ef's public replica is the model a device answers with) is stored
    once: meta's ``model_aliases`` names the state array that holds it. ``stamp``: a random name of this write."""
    aliases = model_aliases(state.arrays, state.model)
    meta = {"run_id": state.run_id, "round": state.round, "model_meta": state.model_meta, "model_aliases": aliases,
            "stamp": stamp}
    save_arrays(path, state.arrays, meta, {name: value for name, value in state.model.items() if name not in aliases},
                model_prefix=SHARING_MODEL if aliases else "m/")


def model_aliases(arrays: dict[str, np.ndarray], model: dict[str, np.ndarray]) -> dict[str, str]:
    """Model array name -> the state array ending in ``/NAME`` (or named NAME) with the same dtype, shape and
    bytes."""
    by_tail: dict[str, list[str]] = {}
    for key in arrays:
        by_tail.setdefault(key.rsplit("/", 1)[-1], []).append(key)
    aliases = {}
    for name, value in model.items():
        value = np.asarray(value)
        for key in by_tail.get(name, ()):
            held = np.asarray(arrays[key])
            if held.dtype == value.dtype and held.shape == value.shape and np.array_equal(
                    np.ascontiguousarray(held).view(np.uint8), np.ascontiguousarray(value).view(np.uint8)):
                aliases[name] = key
                break
    return aliases


def _load(path: Path, with_model: bool = False) -> StoredState | None:
    if not path.exists():
        return None
    arrays, meta, model = load_arrays_and_model(path, "a/", ("m/", SHARING_MODEL) if with_model else None)
    if with_model:
        model.update({name: arrays[key] for name, key in dict(meta.get("model_aliases") or {}).items()})
    return StoredState(run_id=str(meta["run_id"]), round=int(meta["round"]), arrays=arrays, model=model,
                       model_meta=dict(meta.get("model_meta") or {}))


def _load_round(path: Path) -> tuple[str, int] | None:
    """The run and round of a stored state, without reading its arrays (a commit needs no more)."""
    if not path.exists():
        return None
    meta = load_meta(path)
    return str(meta["run_id"]), int(meta["round"])


def stamp_of(path: Path) -> str | None:
    """The stamp a stored state was written with (None when absent or unreadable)."""
    try:
        stamp = load_meta(path).get("stamp")
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    return stamp if isinstance(stamp, str) and stamp else None


class DeviceState:
    """committed.npz and pending.npz under the agent's state directory."""

    def __init__(self, state_dir: str | Path, keep_sessions: int = 3) -> None:
        if keep_sessions < 1:
            raise ValueError(f"keep_sessions must be >= 1, got {keep_sessions}")
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.committed_path = self.dir / "committed.npz"
        self.pending_path = self.dir / "pending.npz"
        self.masked_path = self.dir / "masked.json"  # the last round a masked input was sent for
        self.sessions_dir = self.dir / "sessions"
        self.keep_sessions = keep_sessions
        self.current_run: str | None = None  # the run of committed.npz, once read (a commit keeps it up to date)
        # What this process wrote as pending.npz (run, round, the write's stamp, a copy of its arrays) and, once
        # promoted, what committed.npz holds (run, stamp, arrays): a round reads its committed state from memory
        # while the file carries that stamp (anything else that replaced or removed it is read from disk).
        self.written: tuple[str, int, str, dict[str, np.ndarray]] | None = None
        self.held: tuple[str, str, dict[str, np.ndarray]] | None = None

    def archived_path(self, run_id: str) -> Path:
        """Where an earlier session's committed state is kept (a file name made of the run id)."""
        safe = run_id if re.fullmatch(r"[A-Za-z0-9._-]{1,64}", run_id) and run_id not in (".", "..") else \
            hashlib.sha256(run_id.encode()).hexdigest()[:32]
        return self.sessions_dir / f"{safe}.npz"

    def committed(self, run_id: str) -> dict[str, np.ndarray]:
        """The committed state of this run: the current one, or an earlier session's kept one; empty for a new run
        (the state of another run is never reused)."""
        if self.held is not None and self.held[0] == run_id and self.held[1] == stamp_of(self.committed_path):
            return {name: value.copy() for name, value in self.held[2].items()}
        for path in (self.committed_path, self.archived_path(run_id)):
            state = _load(path)
            if state is not None and state.run_id == run_id:
                return dict(state.arrays)
        return {}

    def sessions(self) -> list[str]:
        """The runs whose state this device keeps, the current one first."""
        runs = []
        current = _load(self.committed_path)
        if current is not None:
            runs.append(current.run_id)
        if self.sessions_dir.exists():
            for path in sorted(self.sessions_dir.glob("*.npz"), key=lambda p: p.stat().st_mtime, reverse=True):
                stored = _load(path)
                if stored is not None and stored.run_id not in runs:
                    runs.append(stored.run_id)
        return runs

    def archive_for(self, run_id: str) -> None:
        """Before another run's state becomes the committed one: keep the current run's (a rename), and remove
        the sessions beyond ``keep_sessions``."""
        if self.current_run is None:
            current = _load_round(self.committed_path)
            self.current_run = current[0] if current is not None else ""
        if self.current_run in ("", run_id):
            return
        self.held = None
        if self.keep_sessions > 1:
            self.sessions_dir.mkdir(exist_ok=True)
            replace_durably(self.committed_path, self.archived_path(self.current_run))
        self.archived_path(run_id).unlink(missing_ok=True)  # the run that commits now is current again
        if self.sessions_dir.exists():
            kept = sorted(self.sessions_dir.glob("*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
            for path in kept[max(self.keep_sessions - 1, 0):]:
                path.unlink(missing_ok=True)

    def write_pending(self, run_id: str, round_number: int, arrays: dict[str, np.ndarray],
                      model: dict[str, np.ndarray] | None = None, model_meta: dict[str, Any] | None = None) -> None:
        self.written, stamp = None, os.urandom(12).hex()
        _save(self.pending_path, StoredState(run_id, round_number, arrays, dict(model or {}), dict(model_meta or {})),
              stamp)
        self.written = (run_id, round_number, stamp,
                        {name: np.array(value, copy=True) for name, value in arrays.items()})

    def note_masked(self, run_id: str, round_number: int) -> None:
        """Remember durably the last round of run ``run_id`` this device masked an input of
        (``protocol.events.Masked``), beside the other runs' (the ``MASKED_RUNS`` most recent: a device that joins
        another session meanwhile still refuses to mask the first one's round again)."""
        runs = {run: last for run, last in self.masked_rounds().items() if run != run_id}
        runs[run_id] = round_number  # the most recent last
        kept = dict(list(runs.items())[-MASKED_RUNS:])
        atomic_write_bytes(self.masked_path, json.dumps({"runs": [[run, last] for run, last in kept.items()]}).encode())

    def masked_rounds(self) -> dict[str, int]:
        """Run id -> the last round this device masked an input of, oldest first."""
        try:
            noted = json.loads(self.masked_path.read_text())
            if "runs" not in noted:  # the first form of the file: one session's
                return {str(noted["run_id"]): int(noted["round"])}
            return {str(run): int(last) for run, last in noted["runs"]}
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError) as error:  # unreadable: the agent does not start (fails closed)
            raise ValueError(f"{self.masked_path} cannot be read ({error}): this device cannot tell which rounds "
                             "it masked; remove the file only when no secure session it served will resume") from None

    def committed_model(self) -> StoredState | None:
        """The latest committed state with its prediction model (of whatever run), or None before the first
        commit or when that state carries no model."""
        state = _load(self.committed_path, with_model=True)
        return state if state is not None and state.model else None

    def confirm(self, run_id: str, accepted_round: int) -> bool:
        """Promote the pending state if it is this run's state of ``accepted_round``; drop it if it is older."""
        pending = _load_round(self.pending_path)
        if pending is None:
            return False
        pending_run, pending_round = pending
        if pending_run != run_id:
            self.drop_pending()
            return False
        if pending_round == accepted_round:
            self.archive_for(run_id)
            written, self.written = self.written, None
            replace_durably(self.pending_path, self.committed_path)
            self.current_run = run_id
            self.held = (run_id, written[2], written[3]) \
                if written is not None and written[:2] == (run_id, pending_round) else None
            return True
        if pending_round < accepted_round:
            self.drop_pending()
        return False

    def drop_pending(self) -> None:
        self.written = None
        self.pending_path.unlink(missing_ok=True)

    def discard_unconfirmed(self, run_id: str, last_accepted_round: int) -> None:
        """At the start of a round: keep nothing pending that the coordinator did not accept."""
        self.confirm(run_id, last_accepted_round)
        self.drop_pending()
