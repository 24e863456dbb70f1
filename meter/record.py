"""The per-round record an ``AgentMeter`` returns, and ``round_totals`` that aggregates records over agents.

``build_record`` flattens one round into JSON-able fields (listed in docs/meter.md, plus per-phase ones);
``round_totals`` sums FLOPs, bytes, CPU seconds and energy over the agents of a round for the coordinator's
metrics.jsonl, takes the max of peaks and temperatures and the min of frequencies. A field unknown for some agents
totals to null with a note (a partial sum would look like a complete one), and energy is summed only when every
agent's figure has the same kind, source and scope.

Energy is counted once per host: every record names its host (``host``, and ``host_id``, a hash of
/etc/machine-id, so that two boards both called "raspberrypi" stay apart; the two together are the key). A figure of a whole-machine scope
(board, cpu-package, module, pmic-rails, wall) measured by several agents of one host covers the same joules, so a
round's total takes, per host, the largest of its agents' figures (their windows overlap; the largest comes
closest to their union) and sums over hosts; ``attribute_energy`` splits a host's figure among its agents by their
CPU seconds. A ``process-share`` figure is already one process's share and is summed. Must not import torch, zmq
or any Fedge package.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fedge.meter.figure import Figure
from fedge.meter.net import TcpCounters
from fedge.meter.process import MB, CpuClock

if TYPE_CHECKING:
    from fedge.meter.energy import Tally
    from fedge.meter.window import MeterFacts, RoundWindow

PHASES: tuple[str, ...] = ("receive", "decode", "train", "encode", "send")
TRAINING_FIELDS = ("flops_train", "flops_fwd_bwd", "flops_opt_executed", "flops_opt_updated",
                   "flops_theoretical_sparse", "batch_size", "steps", "samples", "params_total",
                   "params_trainable", "params_updated", "params_mask_claim", "optimizer", "opt_flops_per_element")
BYTE_FIELDS = tuple(f"{kind}_{direction}" for kind in ("bytes_payload", "bytes_zmtp", "bytes_handshake",
                                                        "bytes_wire_est", "bytes_tcp", "messages", "frames")
                    for direction in ("down", "up"))
SUM_FIELDS = ("flops_train", "flops_fwd_bwd", "flops_opt_executed", "flops_opt_updated", "flops_theoretical_sparse",
              "steps", "samples", "params_updated", "cpu_s", "cpu_user_s", "cpu_sys_s", *BYTE_FIELDS,
              *(f"cpu_s_{phase}" for phase in PHASES), "iface_rx_bytes", "iface_tx_bytes")
MAX_FIELDS = ("rss_peak_mb", "temp_c_max", "wall_s", "batch_size", "params_total",
              *(f"rss_peak_mb_{phase}" for phase in PHASES))
MIN_FIELDS = ("cpu_freq_mhz_min",)
ENERGY_FIELDS = ("energy_j", *(f"energy_j_{phase}" for phase in PHASES))
PER_PROCESS_SCOPES = frozenset({"process-share"})


def host_identity(machine_id: str = "/etc/machine-id") -> tuple[str, str]:
    """(host name, host id): the id hashes /etc/machine-id (unique per installed system); the name stands in for it
    where that file cannot be read."""
    name = socket.gethostname()
    try:
        with open(machine_id, "rb") as handle:
            text = handle.read().strip()
    except OSError:
        text = b""
    return name, hashlib.sha256(text).hexdigest()[:16] if text else f"name:{name}"


def build_record(meter: MeterFacts, current: RoundWindow, clock: CpuClock, tally: Tally | None,
                 tcp_after: Mapping[tuple[str, int], TcpCounters] | None, iface_after: tuple[int, int] | None,
                 temp: float | None, zone: str | None, freq: float | None) -> dict[str, Any]:
    start = current.clock
    host, host_id = meter.host
    record: dict[str, Any] = {"round": current.number, "t_start": current.t_start, "t_end": time.time(),
                              "wall_s": clock.wall - start.wall, "host": host, "host_id": host_id}
    train = current.training
    for name in TRAINING_FIELDS:
        record[name] = train.get(name)
    if train:
        opt = train.get("flops_opt_executed")
        record["flops_train"] = None if opt is None else train["flops_fwd_bwd"] + opt
    record.update(flops_kind="computed" if train else None,
                  flops_method="FlopCounterMode fwd+bwd (matmul/conv) x steps; optimizer per-element table"
                  if train else None)
    record.update(_energy_fields(meter, current, tally))
    record.update(cpu_s=(clock.user + clock.system) - (start.user + start.system),
                  cpu_user_s=clock.user - start.user, cpu_sys_s=clock.system - start.system,
                  rss_peak_mb=current.rss_peak / MB, rss_method=meter.rss.method)
    for name in sorted(set(PHASES) | set(current.phases)):
        stats = current.phases.get(name)
        record[f"cpu_s_{name}"] = stats.cpu_s if stats else None
        record[f"cpu_thread_s_{name}"] = stats.thread_s if stats else None
        record[f"wall_s_{name}"] = stats.wall_s if stats else None
        record[f"rss_peak_mb_{name}"] = stats.rss_peak / MB if stats else None
        record[f"energy_j_{name}"] = stats.energy_j if stats and meter.source else None
    for name in BYTE_FIELDS:
        record[name] = current.counts.get(name, 0)
    record.update(_tcp_fields(current, tcp_after))
    if current.iface and iface_after:
        record.update(iface=meter.iface, iface_rx_bytes=iface_after[0] - current.iface[0],
                      iface_tx_bytes=iface_after[1] - current.iface[1])
    else:
        record.update(iface=meter.iface, iface_rx_bytes=None, iface_tx_bytes=None)
    record.update(temp_c_max=temp, temp_zone=zone, cpu_freq_mhz_min=freq,
                  zmtp_mechanism=meter.mechanism, notes="; ".join(current.notes) or None)
    return record


def _energy_fields(meter: MeterFacts, current: RoundWindow, tally: Tally | None) -> dict[str, Any]:
    notes = list(meter.energy_notes)
    source = meter.source
    if source is None or tally is None or current.energy is None:
        return {"energy_j": None, "energy_kind": None, "energy_source": None, "energy_scope": None,
                "energy_method": None, "energy_note": "; ".join(notes) or "no energy source",
                "energy_samples": None, "energy_max_gap_s": None, "energy_hz": None, "energy_errors": None,
                "energy_constants": None}
    errors = tally.errors - current.energy.errors
    if errors:
        notes.append(f"{errors} failed reads, last: {tally.last_error}")
    figure = Figure(tally.joules - current.energy.joules, "J", source.kind, source.source, source.scope,
                    source.method, tuple(notes))
    fields = figure.as_fields("energy_j")
    fields.update(energy_samples=tally.samples - current.energy.samples, energy_max_gap_s=tally.max_gap_s,
                  energy_hz=min(meter.sampler.hz, source.max_hz) if meter.sampler.running else None,
                  energy_errors=errors, energy_constants=meter.energy_constants())
    return fields


def _tcp_fields(current: RoundWindow, after: Mapping[tuple[str, int], TcpCounters] | None) -> dict[str, Any]:
    before = current.tcp
    if after is None:
        return {"bytes_tcp_down": None, "bytes_tcp_up": None}
    before = before or {}
    up = down = 0
    for local, now in after.items():
        then = before.get(local, TcpCounters(0, 0))  # a connection opened during the round starts at zero
        up += (now.bytes_acked or 0) - (then.bytes_acked or 0)
        down += (now.bytes_received or 0) - (then.bytes_received or 0)
    if set(before) - set(after):
        current.notes.append("a TCP connection closed during the round; its last bytes are not counted")
    return {"bytes_tcp_down": down, "bytes_tcp_up": up}


def round_totals(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Aggregate the AgentMeter records of one round over its agents (see the module docstring)."""
    rows = list(records)
    totals: dict[str, Any] = {"agents": len(rows)}
    rounds = {row.get("round") for row in rows}
    totals["round"] = rounds.pop() if len(rounds) == 1 else None
    notes: list[str] = []
    for names, combine in ((SUM_FIELDS, sum), (MAX_FIELDS, max), (MIN_FIELDS, min)):
        for name in names:
            values = [row.get(name) for row in rows]
            known = [value for value in values if value is not None]
            if known and len(known) < len(values):
                notes.append(f"{name} unknown for {len(values) - len(known)} of {len(values)} agents")
            totals[name] = combine(known) if known and len(known) == len(values) else None
    totals.update(_energy_totals(rows))
    totals["totals_note"] = "; ".join(notes) or None
    return totals


def _host_of(row: Mapping[str, Any], index: int) -> str:
    """The host key of a record: its machine id and host name together (boards flashed from one image share a
    machine id until it is regenerated); a record that names no host (an older agent) is its own host."""
    if not row.get("host_id") and not row.get("host"):
        return f"unnamed:{index}"
    return f"{row.get('host_id')}/{row.get('host')}"


def _energy_totals(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    empty = {name: None for name in ENERGY_FIELDS}
    empty.update(energy_kind=None, energy_source=None, energy_scope=None, energy_hosts=None)
    if not rows:
        return {**empty, "energy_note": "no agents"}
    labels = {(row.get("energy_kind"), row.get("energy_source"), row.get("energy_scope")) for row in rows}
    missing = sum(row.get("energy_j") is None for row in rows)
    if missing:
        return {**empty, "energy_note": f"energy unknown for {missing} of {len(rows)} agents; not summed"}
    if len(labels) > 1:
        described = ", ".join(f"{kind}/{source}/{scope}" for kind, source, scope in sorted(labels, key=str))
        return {**empty, "energy_note": f"agents' energy figures differ in kind/source/scope ({described}); "
                                        "not summed"}
    kind, source, scope = labels.pop()
    hosts: dict[str, list[Mapping[str, Any]]] = {}
    for index, row in enumerate(rows):
        hosts.setdefault(_host_of(row, index), []).append(row)
    totals: dict[str, Any] = {"energy_kind": kind, "energy_source": source, "energy_scope": scope,
                              "energy_hosts": len(hosts), "energy_note": None}
    shared = scope not in PER_PROCESS_SCOPES and any(len(members) > 1 for members in hosts.values())
    for name in ENERGY_FIELDS:
        values = [row.get(name) for row in rows]
        if not all(value is not None for value in values):
            totals[name] = None
        elif scope in PER_PROCESS_SCOPES:
            totals[name] = sum(values)
        elif name == "energy_j":
            totals[name] = sum(max(float(m["energy_j"]) for m in members) for members in hosts.values())
        else:  # phases of agents sharing a machine overlap in no known way: no per-phase total
            totals[name] = None if shared else sum(values)
    if shared:
        most = max(len(members) for members in hosts.values())
        totals["energy_note"] = (f"up to {most} agents share a host; energy_j counts each host once (its "
                                 "agents' largest figure), per-phase energy is not totalled")
    return totals


def attribute_energy(rows: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Each agent's share of its host's energy in this round: the host's figure (the largest of its agents'
    whole-machine figures) times the agent's CPU seconds over the host's agents' CPU seconds (equal parts when none
    used any CPU). A process-share figure is its own share. None where energy or CPU time is unknown."""
    hosts: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        hosts.setdefault(_host_of(row, index), []).append(index)
    shares: list[float | None] = [None] * len(rows)
    for members in hosts.values():
        if any(rows[i].get("energy_j") is None or rows[i].get("cpu_s") is None for i in members):
            continue
        if len({rows[i].get("energy_scope") for i in members}) > 1:  # not one kind of figure: no share
            continue
        joules = [float(rows[i]["energy_j"]) for i in members]
        seconds = [float(rows[i]["cpu_s"]) for i in members]
        if {rows[i].get("energy_scope") for i in members} <= PER_PROCESS_SCOPES:
            for i, own in zip(members, joules, strict=True):
                shares[i] = own
            continue
        total_cpu = sum(seconds)
        for i, used in zip(members, seconds, strict=True):
            shares[i] = max(joules) * (used / total_cpu if total_cpu > 0 else 1.0 / len(members))
    return shares
