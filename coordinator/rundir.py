"""The run directory: where a session writes its configuration, records, checkpoint, final model and provenance.

Layout (docs/run-dir.md is the specification, version ``RUN_DIR_VERSION``): ``config.toml`` (effective config),
``endpoint`` (the bound address), ``provenance.json``, ``metrics.jsonl`` (one object per completed round),
``clients.jsonl`` (one object per agent per round), ``checkpoint.npz`` (written atomically every round),
``status.json`` (live state for ``coordinator status``), ``coordinator.log`` (JSON lines), ``model.npz`` and
``model.onnx`` (final model), ``report.json`` (summary), ``data/`` (local-fleet shards), ``agents/`` (local-fleet
agent state and logs). Knows nothing of sockets or algorithms.
"""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedge.plumbing import atomic_write_bytes, fsync_file, load_arrays, save_arrays

__all__ = ["METER_FIELDS", "METRICS_FIELDS", "SPENT_FIELDS", "RunDir", "atomic_write_bytes", "load_arrays", "plain", "save_arrays"]

RUN_DIR_VERSION = 1

# Every metrics.jsonl line has these keys (null when they do not apply), in this order; algorithms may add more.
METRICS_FIELDS = (
    "round", "algorithm", "selected", "reported", "dropped", "unavailable", "accepted", "selected_indices",
    "test_accuracy", "test_loss",
    "test_f1_macro", "test_exact_match", "test_label_accuracy", "test_mse", "test_mae", "eval_source",
    "eval_samples", "test_accuracy_pruned", "personal_accuracy_mean", "personal_accuracy", "bytes_down", "bytes_up",
    "bytes_up_tensors", "train_loss", "wall_s", "train_s_max", "eval_s", "checkpoint_s", "receive_s", "fold_s",
    "downlink_s", "close_s", "tail_s", "epsilon", "clip", "noise_std", "dp_released", "dp_dropouts",
    "secagg_attempt", "secagg_summed", "secagg_failed", "secagg_recovered",
)
# Where a round's time went on the coordinator (seconds, a simulated fleet's too): frames decoded and checked,
# updates folded, tasks encoded and sent, the aggregate closed, and the tail from the last accepted update to the
# Commits sent (closing, records and the checkpoint included).
SPENT_FIELDS = ("receive_s", "fold_s", "downlink_s", "close_s", "tail_s")

# Per-round totals over the agents' meter records (docs/meter.md), also in every metrics.jsonl line.
METER_FIELDS = (
    "flops_train", "flops_fwd_bwd", "flops_opt_executed", "flops_opt_updated", "flops_theoretical_sparse",
    "energy_j", "energy_kind", "energy_source", "energy_scope", "energy_hosts", "energy_note", "cpu_s", "rss_peak_mb",
    "bytes_payload_down", "bytes_payload_up", "bytes_zmtp_down", "bytes_zmtp_up", "bytes_tcp_down", "bytes_tcp_up",
    "temp_c_max", "cpu_freq_mhz_min",
)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class RunDir:
    """Paths and writers of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint.npz"

    def write_text(self, name: str, text: str) -> None:
        atomic_write_bytes(self.path / name, text.encode())

    def write_json(self, name: str, obj: Any) -> None:
        self.write_text(name, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")

    def append_jsonl(self, name: str, *objs: Mapping[str, Any], durable: bool = False) -> None:
        """Append one line per object (in one write); ``durable``: fsynced before it returns."""
        with open(self.path / name, "a", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(obj, default=_json_default) + "\n" for obj in objs))
            handle.flush()
            if durable:
                fsync_file(handle.fileno())

    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        path = self.path / name
        if not path.exists():
            return []
        rows = []
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
        return rows

    def truncate_jsonl(self, name: str, last_round: int) -> None:
        """Drop records of rounds after ``last_round`` (written before a crash, not in the checkpoint)."""
        rows = [r for r in self.read_jsonl(name) if int(r.get("round", 0)) <= last_round]
        self.write_text(name, "".join(json.dumps(r) + "\n" for r in rows))

    def write_status(self, **status: Any) -> None:
        """status.json: what `coordinator status` shows (round, phase, agents, ETA), with the time written."""
        self.write_json("status.json", {**status, "updated_at": time.time()})

    def write_prometheus(self, gauges: Sequence[tuple[str, str, Mapping[str, str], float]]) -> None:
        """fedge.prom: the Prometheus text format for node_exporter's textfile collector (written atomically, as it
        requires); each gauge is (name, help, labels, value)."""
        lines: list[str] = []
        described: set[str] = set()
        for name, text, labels, value in gauges:
            if name not in described:
                described.add(name)
                lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
            pairs = ",".join(f'{key}="{prometheus_label(val)}"' for key, val in labels.items())
            number = float(value)
            text = str(int(number)) if number.is_integer() else repr(number)
            lines.append(f"{name}{{{pairs}}} {text}" if pairs else f"{name} {text}")
        self.write_text("fedge.prom", "\n".join(lines) + "\n")

    def write_provenance(self, seed: int, endpoint: str, extra: Mapping[str, Any]) -> None:
        import torch

        from fedge import __version__

        self.write_json("provenance.json", {
            "run_dir_version": RUN_DIR_VERSION,
            "fedge_version": __version__,
            "git_commit": git_commit(),
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "seed": seed,
            "endpoint": endpoint,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **extra,
        })
        self.write_text("endpoint", endpoint + "\n")  # last: its presence says the rest is there


def prometheus_label(value: str) -> str:
    """A label value escaped as the text format wants (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def plain(obj: Any) -> Any:
    """``obj`` as JSON reads it back (numpy scalars and arrays as numbers and lists): for a checkpoint's meta."""
    return json.loads(json.dumps(obj, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
