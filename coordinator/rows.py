"""A closed round's records: each agent's meter record completed with the update's own bytes, the round's row of
metrics.jsonl (with the agents' own evaluations when the session has no test set) and its rows of clients.jsonl;
and the same of a flushed asynchronous version.
Pure functions over decoded messages and plain values; no sockets, no algorithms, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedge import codec
from fedge.algorithms.task import METRIC_NAMES as EVAL_METRICS
from fedge.coordinator.rundir import METER_FIELDS, METRICS_FIELDS
from fedge.meter import round_totals, zmtp
from fedge.meter.record import ENERGY_FIELDS, MAX_FIELDS, MIN_FIELDS, SUM_FIELDS
from fedge.protocol.asynchronous import Flush
from fedge.protocol.round import RoundState
from fedge.protocol.versions import VersionRecord

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
    """Personal accuracies, the sample-weighted training loss, the slowest training time and how many devices
    scaled their update under the task's norm bounds (their own report), from (client id, update) pairs."""
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
    row["device_clipped"] = sum(1 for _, u in received if u.clip_scale < 1.0)
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
                shares: Sequence[float | None],
                bounds: Mapping[int, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """clients.jsonl's rows of a closed round: one per accepted update (in client order), then one per client that
    declined the round by its availability rules, then one per client whose update was refused (``refused``: why). ``bounds``: what bounded influence did to each update
    (``protocol.influence.Bounded.record``: the claim, the counted samples, norms, clipping)."""
    rows = []
    for (index, (update, size)), record, share in zip(sorted(current.updates.items()), records, shares, strict=True):
        rows.append({**record, "round": number, "client_id": client_ids[index], "client_index": index,
                     "available": True, "num_samples": update.num_samples,
                     "bytes_down": current.bytes_down.get(index, 0), "bytes_up": size,
                     "bytes_up_tensors": current.body_up.get(index, 0), "train_loss": finite(update.train_loss),
                     "train_s": finite(update.train_s), "energy_j_share": share, **client_evaluation(update),
                     "device_clip_scale": update.clip_scale, "dp_norm": None, "dp_scale": None, "dp_unclipped": None,
                     **(bounds or {}).get(index, {})})
    for index, reason in sorted(current.unavailable.items()):
        rows.append({"round": number, "client_id": client_ids[index], "client_index": index, "available": False,
                     "unavailable_reason": reason, "bytes_down": current.bytes_down.get(index, 0)})
    for index, reason in sorted(current.refused.items()):
        rows.append({"round": number, "client_id": client_ids[index], "client_index": index, "available": True,
                     "refused": reason, "bytes_down": current.bytes_down.get(index, 0)})
    return rows


def finite(value: float) -> float | None:
    """A figure for a JSON record: None for NaN and infinities (JSON has neither)."""
    return value if math.isfinite(value) else None


def version_row(number: int, algorithm: str, flush: Flush, record: VersionRecord, extra: Mapping[str, Any],
                records: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics.jsonl's row of a flushed asynchronous version (``round`` is the version): the fields of a round's
    row where they mean something (``selected``: the devices sent a task while it was built; ``accepted``: the
    client index of each update in it, in arrival order) and ``updates``, ``staleness_mean``, ``staleness_max``,
    ``cancelled``."""
    row: dict[str, Any] = dict.fromkeys(METRICS_FIELDS + METER_FIELDS)
    row.update(round=number, algorithm=algorithm, selected=len(record.bytes_down), reported=len(record.updates),
               dropped=0, unavailable=0, accepted=[u[0] for u in record.updates],
               selected_indices=sorted(record.bytes_down), bytes_down=sum(record.bytes_down.values()),
               bytes_up=sum(u[3] for u in record.updates), bytes_up_tensors=None, updates=len(flush.arrivals),
               cancelled=len(flush.cancelled), **flush.staleness())
    row.update(update_summary([(str(u[0]), u[2]) for u in record.updates]))
    row.update(extra)
    row.update(meter_totals(records))
    return row


def client_rows_of_version(number: int, record: VersionRecord, client_ids: Mapping[int, str],
                           records: list[dict[str, Any]], shares: Sequence[float | None],
                           bounds: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """clients.jsonl's rows of a flushed version: one per update in it, in arrival order, with its ``task`` and
    ``staleness``; then one per update its fold refused (``refused``: why)."""
    refused = [{"round": number, "client_id": client_ids[index], "client_index": index, "task": task,
                "available": True, "refused": reason, "bytes_down": record.bytes_down.get(index, 0)}
               for index, task, reason in record.refused]
    return [{**meter, "round": number, "client_id": client_ids[index], "client_index": index, "task": task,
             "staleness": staleness, "available": True, "num_samples": update.num_samples,
             "bytes_down": record.bytes_down.get(index, 0), "bytes_up": size, "bytes_up_tensors": None,
             "train_loss": finite(update.train_loss), "train_s": finite(update.train_s), "energy_j_share": share,
             **client_evaluation(update), "device_clip_scale": update.clip_scale, "dp_norm": None, "dp_scale": None,
             "dp_unclipped": None, **bounds.get(index, {})}
            for (index, task, update, size, staleness), meter, share in zip(record.updates, records, shares,
                                                                             strict=True)] + refused
