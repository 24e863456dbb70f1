"""What the coordinator checks and records: updates validated against the model and the masks sent, the per-agent
meter record completed with the update's own bytes, a closed round's rows of metrics.jsonl and clients.jsonl, the
welcome's session settings, and the checkpoint file (arrays + JSON meta, written atomically).

Pure functions over decoded messages and plain values; no sockets, no algorithms, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedge import codec
from fedge.algorithms.task import METRIC_NAMES as EVAL_METRICS
from fedge.coordinator.config import Config
from fedge.coordinator.rundir import METER_FIELDS, METRICS_FIELDS, load_arrays, save_arrays
from fedge.meter import round_totals, zmtp
from fedge.meter.record import ENERGY_FIELDS, MAX_FIELDS, MIN_FIELDS, SUM_FIELDS
from fedge.models import ModelSpec
from fedge.protocol.round import RoundState

NUMERIC_FIELDS = frozenset((*SUM_FIELDS, *MAX_FIELDS, *MIN_FIELDS, *ENERGY_FIELDS, "cpu_s_decode"))


def agent_record(record: object, update_bytes: int, curve: bool) -> dict[str, Any]:
    """An agent's meter record, completed with the update packet that carried it (counted where it arrived:
    the record cannot describe its own packet). Records that are not flat maps of scalars, or hold anything but a
    number (or null) where the round's totals add, compare or split figures, are dropped: a record must never stop
    the round that carries it."""
    if not isinstance(record, dict) or not all(isinstance(v, (int, float, str, bool, type(None)))
                                               for v in record.values()):
        return {}
    for key in NUMERIC_FIELDS:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                                  not math.isfinite(value)):
            return {}
    record = dict(record)
    framed = zmtp.message_bytes([update_bytes], "CURVE" if curve else "NULL")
    for key, value in (("bytes_payload_up", update_bytes), ("bytes_zmtp_up", framed), ("messages_up", 1)):
        previous = record.get(key)
        record[key] = (previous if isinstance(previous, (int, float)) else 0) + value
    return record


def meter_totals(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The round's totals over agents (docs/run-dir.md: flops_train, energy_j, cpu_s, ...); nulls without records."""
    totals = round_totals(records) if records and all(records) else {}
    return {name: totals.get(name) for name in METER_FIELDS}


def update_summary(received: Sequence[tuple[str, codec.Update]]) -> dict[str, Any]:
    """Personal accuracies, the sample-weighted training loss and the slowest training time of a round, from
    (client id, update) pairs."""
    row: dict[str, Any] = {}
    personal = {cid: u.personal_accuracy for cid, u in received
                if u.personal_accuracy is not None and math.isfinite(u.personal_accuracy)}
    if personal:
        row["personal_accuracy"] = personal
        row["personal_accuracy_mean"] = float(np.mean(list(personal.values())))
    losses = [u.train_loss for _, u in received]
    if losses and all(math.isfinite(x) for x in losses):
        row["train_loss"] = float(np.average(losses, weights=[max(u.num_samples, 1) for _, u in received]))
    times = [u.train_s for _, u in received if math.isfinite(u.train_s)]
    row["train_s_max"] = max(times) if times else None
    return row


def client_evaluation(update: codec.Update) -> dict[str, Any]:
    """An agent's own evaluation of the model it received, as clients.jsonl fields ``test_*`` (all null when it
    sent none)."""
    fields: dict[str, Any] = {f"test_{name}": None for name in EVAL_METRICS}
    if update.eval_samples > 0:
        for name in EVAL_METRICS:
            value = update.evaluation.get(name)
            if isinstance(value, float) and math.isfinite(value):
                fields[f"test_{name}"] = value
    return fields


def agents_evaluation(updates: Sequence[codec.Update]) -> tuple[dict[str, float | None], int]:
    """The sample-weighted mean of the agents' evaluations (weights: their test-split sizes) and the samples."""
    rows: list[tuple[dict[str, Any], int]] = []
    for update in updates:
        fields = client_evaluation(update)
        if any(v is not None for v in fields.values()):
            rows.append((fields, update.eval_samples))
    if not rows:
        return {}, 0
    total = sum(n for _, n in rows)
    means: dict[str, float | None] = {}
    for name in EVAL_METRICS:
        values = [(fields[f"test_{name}"], n) for fields, n in rows if fields[f"test_{name}"] is not None]
        means[name] = (sum(v * n for v, n in values) / sum(n for _, n in values)) if values else None
    return means, total


def welcome_fields(c: Config, spec: ModelSpec, model_hash: str, index: int, capacity: int) -> dict[str, Any]:
    """The session settings of a Welcome (``codec.Welcome``'s fields): everything an agent needs to build its model
    and client half."""
    return {
        "client_index": index, "num_clients": capacity, "seed": c.run.seed, "model_hash": model_hash,
        "model": spec.as_dict(),
        "algorithm": c.algorithm_name, "algorithm_options": dict(c.algorithm_options),
        "train": {"epochs": c.train.epochs, "batch_size": c.train.batch_size, "lr": c.train.lr,
                  "optimizer": c.train.optimizer, "momentum": c.train.momentum,
                  "weight_decay": c.train.weight_decay, "loss": c.train.loss,
                  "class_weights": list(c.train.class_weights)},
        "train_limit": c.data.train_limit,
        "heartbeat_s": c.fleet.heartbeat_s, "liveness_s": c.fleet.liveness_s,
    }


def fleet_gauges(run_id: str, round_number: int, rounds: int, agents: list[dict[str, Any]],
                 bytes_total: Mapping[str, int], rejections: Mapping[str, int],
                 eta_s: float | None) -> list[tuple[str, str, dict[str, str], float]]:
    """The Prometheus gauges of ``fedge.prom`` (docs/deployment.md, "Checking on the fleet")."""
    connected = sum(1 for a in agents if a["connected"])
    run = {"run": run_id}
    gauges: list[tuple[str, str, dict[str, str], float]] = [
        ("fedge_round", "The last committed round.", run, round_number),
        ("fedge_rounds", "The rounds the session is to play.", run, rounds),
        ("fedge_agents_connected", "Agents heard from within the liveness.", run, connected),
        ("fedge_agents_registered", "Agents that hold a client index.", run, len(agents)),
        *(("fedge_bytes", "Packet bytes of the recorded rounds.", {**run, "direction": d}, n)
          for d, n in bytes_total.items()),
        *(("fedge_agent_seconds_since_seen", "Seconds since each agent was last heard from.",
           {**run, "client": str(a["client_id"])}, float(a["seconds_since_seen"]))
          for a in agents if a["seconds_since_seen"] is not None),
        *(("fedge_rejections", "Messages refused per peer (the 100 largest counts).", {**run, "peer": peer}, n)
          for peer, n in rejections.items()),
    ]
    if eta_s is not None:
        gauges.append(("fedge_eta_seconds", "Estimated seconds until the last round.", run, eta_s))
    return gauges


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


def agents_metrics(updates: Sequence[codec.Update]) -> dict[str, Any]:
    """A round's test metrics in a session without a test set of its own: the sample-weighted mean of the agents'
    evaluations of the model they received this round (``eval_source = "agents"``); the coordinator's own test set
    is evaluated beside the next round (``coordinator.deferred``)."""
    metrics, samples = agents_evaluation(list(updates))
    if not metrics:
        return {}
    return {**{f"test_{name}": value for name, value in metrics.items()}, "eval_source": "agents",
            "eval_samples": samples}


def round_row(number: int, algorithm: str, current: RoundState, missing: Sequence[int], received: Sequence[Any],
              extra: Mapping[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics.jsonl's row of a closed round (every field of METRICS_FIELDS and METER_FIELDS; the test metrics and
    ``wall_s`` are the caller's)."""
    row: dict[str, Any] = dict.fromkeys(METRICS_FIELDS + METER_FIELDS)
    row.update(round=number, algorithm=algorithm, selected=len(current.selected), reported=len(current.updates),
               dropped=len(missing), unavailable=len(current.unavailable), accepted=sorted(current.updates),
               selected_indices=sorted(current.selected),
               bytes_down=sum(current.bytes_down.values()), bytes_up=sum(size for _, size in current.updates.values()),
               bytes_up_tensors=sum(current.body_up.values()))
    row.update(update_summary(received))
    row.update(extra)
    row.update(meter_totals(records))
    return row


def client_rows(number: int, current: RoundState, client_ids: Mapping[int, str], records: list[dict[str, Any]],
                shares: Sequence[float | None]) -> list[dict[str, Any]]:
    """clients.jsonl's rows of a closed round: one per accepted update (in client order), then one per client that
    declined the round by its availability rules."""
    rows = []
    for (index, (update, size)), record, share in zip(sorted(current.updates.items()), records, shares, strict=True):
        rows.append({**record, "round": number, "client_id": client_ids[index], "client_index": index,
                     "available": True, "num_samples": update.num_samples,
                     "bytes_down": current.bytes_down.get(index, 0), "bytes_up": size,
                     "bytes_up_tensors": current.body_up.get(index, 0), "train_loss": finite(update.train_loss),
                     "train_s": finite(update.train_s), "energy_j_share": share, **client_evaluation(update)})
    for index, reason in sorted(current.unavailable.items()):
        rows.append({"round": number, "client_id": client_ids[index], "client_index": index, "available": False,
                     "unavailable_reason": reason, "bytes_down": current.bytes_down.get(index, 0)})
    return rows


def finite(value: float) -> float | None:
    """A figure for a JSON record: None for NaN and infinities (JSON has neither)."""
    return value if math.isfinite(value) else None
