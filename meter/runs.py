"""Run directories as data: loading them, totals per figure and definition, reductions, and the DSSA claims check.

A run directory holds ``metrics.jsonl`` (one object per round, with the coordinator's ``bytes_down``/``bytes_up`` and
the ``round_totals`` fields), optionally ``clients.jsonl`` (one AgentMeter record per agent per round, plus
``client_id``) and ``report.json`` (the run summary). ``MEASURES`` names each figure with the accounting it uses;
``reductions`` compares two runs per measure, and refuses (a note, no number) where the energy labels differ or a
figure is unknown in some round. ``claims_check`` sets a DSSA run's measured reductions beside the DSSA paper's
claims. Pure Python: must not import torch, zmq, matplotlib or any Fedge package.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedge.meter.figure import Figure

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Run:
    path: Path
    metrics: list[dict[str, Any]]
    clients: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def algorithm(self) -> str:
        return str(self.summary.get("algorithm") or (self.metrics[0].get("algorithm") if self.metrics else None)
                   or "unknown")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_run(path: str | Path) -> Run:
    path = Path(path)
    metrics = _jsonl(path / "metrics.jsonl")
    if not metrics:
        raise FileNotFoundError(f"{path / 'metrics.jsonl'} is missing or empty")
    summary_path = path / "report.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return Run(path, sorted(metrics, key=lambda row: row.get("round", 0)), _jsonl(path / "clients.jsonl"), summary)


def _sum_of(*names: str) -> Callable[[Row], float | None]:
    def value(row: Row) -> float | None:
        total = 0.0
        for name in names:
            part = row.get(name)
            if part is None:
                return None
            total += float(part)
        return total
    return value


def _theoretical(row: Row) -> float | None:
    sparse = row.get("flops_theoretical_sparse")
    dense, optimizer = row.get("flops_fwd_bwd"), row.get("flops_opt_updated")
    forward_backward = sparse if sparse is not None else dense
    return None if forward_backward is None or optimizer is None else float(forward_backward + optimizer)


@dataclass(frozen=True)
class Measure:
    key: str
    quantity: str
    unit: str
    accounting: str
    per_round: Callable[[Row], float | None]


MEASURES: tuple[Measure, ...] = (
    Measure("comm_payload", "communication", "B", "encoded payload bytes, down + up (coordinator's count)",
            _sum_of("bytes_down", "bytes_up")),
    Measure("comm_payload_down", "communication", "B", "encoded payload bytes, down", _sum_of("bytes_down")),
    Measure("comm_payload_up", "communication", "B", "encoded payload bytes, up", _sum_of("bytes_up")),
    Measure("comm_zmtp", "communication", "B", "ZMTP stream bytes (payload + framing + handshakes), down + up",
            _sum_of("bytes_zmtp_down", "bytes_zmtp_up")),
    Measure("comm_tcp", "communication", "B", "kernel TCP_INFO stream bytes (acked up + received down)",
            _sum_of("bytes_tcp_down", "bytes_tcp_up")),
    Measure("compute_executed", "computation", "FLOP",
            "executed: dense fwd+bwd + optimizer on every trainable element", _sum_of("flops_train")),
    Measure("compute_updated", "computation", "FLOP",
            "updated-only: dense fwd+bwd + optimizer on verified updated elements",
            _sum_of("flops_fwd_bwd", "flops_opt_updated")),
    Measure("compute_theoretical", "computation", "FLOP",
            "theoretical: density-scaled fwd+bwd (dense where no mask) + optimizer on updated elements",
            _theoretical),
    Measure("compute_fwd_bwd", "computation", "FLOP", "dense fwd+bwd only", _sum_of("flops_fwd_bwd")),
    Measure("compute_opt_executed", "computation", "FLOP", "optimizer, every trainable element",
            _sum_of("flops_opt_executed")),
    Measure("compute_opt_updated", "computation", "FLOP", "optimizer, verified updated elements",
            _sum_of("flops_opt_updated")),
    Measure("energy", "energy", "J", "agents' energy (kind/source/scope as labelled)", _sum_of("energy_j")),
    Measure("cpu", "cpu time", "s", "agents' process CPU seconds (user + sys)", _sum_of("cpu_s")),
    Measure("wall", "time", "s", "coordinator's round wall-clock time", _sum_of("wall_s")),
)
BY_KEY = {measure.key: measure for measure in MEASURES}


def total(run: Run, measure: Measure) -> float | None:
    """Sum over rounds; None when any round lacks the figure."""
    values = [measure.per_round(row) for row in run.metrics]
    return None if not values or any(v is None for v in values) else float(sum(v for v in values if v is not None))


def energy_label(run: Run) -> tuple[str, str, str] | str:
    """The single (kind, source, scope) of a run's energy, or a string saying why there is none."""
    labels = {(row.get("energy_kind"), row.get("energy_source"), row.get("energy_scope")) for row in run.metrics}
    if len(labels) != 1:
        return f"energy labels vary across rounds: {sorted(map(str, labels))}"
    kind, source, scope = labels.pop()
    if kind is None:
        return "no energy figure"
    return str(kind), str(source), str(scope)


@dataclass(frozen=True)
class Reduction:
    measure: Measure
    value: float | None
    baseline: float | None
    reduction: float | None
    """(baseline - value) / baseline as a fraction; None when it cannot be computed honestly (see ``note``)."""
    note: str | None = None


def reduction_of(run: Run, baseline: Run, measure: Measure) -> Reduction:
    value, base = total(run, measure), total(baseline, measure)
    if value is None or base is None:
        return Reduction(measure, value, base, None, "figure unknown in some round")
    if measure.key == "energy":
        mine, theirs = energy_label(run), energy_label(baseline)
        if isinstance(mine, str) or isinstance(theirs, str):
            return Reduction(measure, value, base, None, mine if isinstance(mine, str) else str(theirs))
        try:
            share = Figure(value, "J", mine[0], mine[1], mine[2]).reduction_vs(  # type: ignore[arg-type]
                Figure(base, "J", theirs[0], theirs[1], theirs[2]))  # type: ignore[arg-type]
        except ValueError as error:
            return Reduction(measure, value, base, None, str(error))
        return Reduction(measure, value, base, share, f"{mine[0]}, {mine[1]}, scope {mine[2]}")
    if base == 0:
        return Reduction(measure, value, base, None, "baseline total is zero")
    return Reduction(measure, value, base, (base - value) / base)


def reductions(run: Run, baseline: Run) -> list[Reduction]:
    return [reduction_of(run, baseline, measure) for measure in MEASURES]


@dataclass(frozen=True)
class Claim:
    quantity: str
    claimed: float
    paper_accounting: str
    measures: tuple[str, ...]
    why: str


CLAIMS: tuple[Claim, ...] = (
    Claim("communication", 0.730, "comm_payload", ("comm_payload", "comm_zmtp", "comm_tcp"),
          "the paper counts transmitted parameters ('MB' = millions of values); encoded payload bytes are the "
          "closest byte count"),
    Claim("computation", 0.349, "compute_updated",
          ("compute_updated", "compute_executed", "compute_theoretical"),
          "the paper keeps forward/backward dense and credits savings to optimizer updates of pruned weights only"),
)


@dataclass(frozen=True)
class ClaimCheck:
    claim: Claim
    measure: Measure
    measured: float | None
    holds: bool | None
    paper_accounting: bool
    note: str | None


def claims_check(dssa: Run, baseline: Run) -> list[ClaimCheck]:
    """Each claim against each accounting; a claim holds when the measured reduction, rounded to 0.1 percentage
    point as the paper states it, is at least the claimed one."""
    checks = []
    for claim in CLAIMS:
        for key in claim.measures:
            result = reduction_of(dssa, baseline, BY_KEY[key])
            holds = None if result.reduction is None else round(result.reduction * 100, 1) >= claim.claimed * 100
            checks.append(ClaimCheck(claim, BY_KEY[key], result.reduction, holds, key == claim.paper_accounting,
                                     result.note))
    return checks


def is_sparse_run(run: Run) -> bool:
    return "dssa" in run.algorithm.lower()


def per_agent(run: Run) -> list[dict[str, Any]]:
    """Per client: rounds reported and sums over rounds (max for peak RSS); None where a figure is unknown."""
    agents: dict[str, list[dict[str, Any]]] = {}
    for row in run.clients:
        if row.get("available", True):  # a round an agent declined by its availability rules has no record
            agents.setdefault(str(row.get("client_id")), []).append(row)
    result = []
    for client, rows in sorted(agents.items()):
        entry: dict[str, Any] = {"client_id": client, "rounds": len(rows)}
        for name in ("bytes_payload_down", "bytes_payload_up", "bytes_zmtp_down", "bytes_zmtp_up", "flops_train",
                     "flops_opt_updated", "energy_j", "cpu_s"):
            values = [row.get(name) for row in rows]
            entry[name] = None if any(v is None for v in values) else sum(values)
        peaks = [float(row["rss_peak_mb"]) for row in rows if row.get("rss_peak_mb") is not None]
        entry["rss_peak_mb"] = max(peaks) if peaks else None
        result.append(entry)
    return result
