"""The coordinator's checkpoint file: the server half's arrays and the session's JSON meta, written atomically every
round, and read back only for the same model definition and algorithm. No sockets, no algorithms, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedge.coordinator.rundir import load_arrays, save_arrays

CHECKPOINT_FORMAT = 1


def save_checkpoint(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    save_arrays(path, arrays, {"format": CHECKPOINT_FORMAT, **meta})


def load_checkpoint(path: Path, model_hash: str, algorithm: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The checkpoint's arrays and meta; refuses another format, model or algorithm with a reason."""
    arrays, meta = load_arrays(path)
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: unsupported checkpoint format {meta.get('format')}")
    if meta.get("model_hash") != model_hash or meta.get("algorithm") != algorithm:
        raise ValueError(f"{path} was written by another model or algorithm "
                         f"({meta.get('algorithm')}, model {meta.get('model_hash')})")
    return arrays, meta
