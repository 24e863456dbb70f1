"""Files both sides write the same way: atomic writes (fsync, rename, fsync of the directory), the exclusive lock of a
directory held by one process, and the named-arrays file (``a/NAME``, ``m/NAME`` and a JSON ``meta``, no pickle) that
checkpoints, device state and models use. Imports nothing of Fedge, never torch or zmq.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

__all__ = ["DirectoryLocked", "atomic_write", "atomic_write_bytes", "fsync_directory", "fsync_file", "hold_directory", "load_arrays",
           "load_arrays_and_model", "load_meta", "replace_durably", "save_arrays", "without_fsync"]

_local = threading.local()


@contextlib.contextmanager
def without_fsync() -> Iterator[None]:
    """Within this block, in this thread, writes stay atomic (temporary file and rename) but are not forced to disk:
    for in-process simulations and tests, where a power cut loses nothing that matters, and for files that only say
    how things are now (the coordinator's status files), which the next write replaces. A service never writes its
    checkpoints, records or state in one."""
    before = getattr(_local, "skip", False)
    _local.skip = True
    try:
        yield
    finally:
        _local.skip = before


def _fsync(fd: int) -> None:
    if not getattr(_local, "skip", False):
        os.fsync(fd)


def fsync_file(fd: int) -> None:
    """Force an open file's written data to disk (skipped inside ``without_fsync``)."""
    _fsync(fd)


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
        _fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_durably(source: Path, target: Path) -> None:
    """Rename ``source`` over ``target`` (same directory) and fsync the directory so the rename survives."""
    os.replace(source, target)
    fsync_directory(target.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync it, rename it over the target, and fsync the
    directory so that the rename survives a power cut."""
    atomic_write(path, lambda handle: handle.write(data))


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``atomic_write_bytes`` for a writer that streams into the (seekable) file itself: no copy in memory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            _fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                model: Mapping[str, np.ndarray] | None = None, model_prefix: str = "m/") -> None:
    """Named arrays plus a JSON meta object in one .npz (``a/NAME``, ``m/NAME`` (``model_prefix``) for ``model``, and
    ``meta``), written atomically, no pickle."""
    payload = {f"a/{k}": np.asarray(v) for k, v in arrays.items()}
    payload.update({f"{model_prefix}{k}": np.asarray(v) for k, v in (model or {}).items()})
    payload["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    atomic_write(path, lambda handle: np.savez(handle, **payload))  # type: ignore[arg-type]


def load_arrays(path: Path, prefix: str = "a/") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    arrays, meta, _ = load_arrays_and_model(path, prefix)
    return arrays, meta


def load_meta(path: Path) -> dict[str, Any]:
    """The JSON meta of a named-arrays file alone (its arrays are not read)."""
    with np.load(path, allow_pickle=False) as data:
        meta: dict[str, Any] = json.loads(bytes(data["meta"]).decode())
    return meta


def load_arrays_and_model(path: Path, prefix: str = "a/", model_prefix: str | Sequence[str] | None = None) -> tuple[
        dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
    """The ``prefix`` arrays, the meta and (with ``model_prefix``, or any of several) the model arrays, all from one
    open of the file, so that a file replaced meanwhile cannot pair one round's meta with another's model."""
    model_prefixes = () if not model_prefix else (model_prefix,) if isinstance(model_prefix, str) else model_prefix
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        arrays = {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}
        model = {k[len(start):]: data[k] for start in model_prefixes for k in data.files if k.startswith(start)}
    return arrays, meta, model
