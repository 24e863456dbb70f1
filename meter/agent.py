"""``AgentMeter``: what an edge agent measures each round, as one flat JSON-able record.

Use: ``meter.start()`` once (background sampler), then per round ``begin_round(r)``, ``with meter.phase("train")``
around each phase, ``add_training(...)``, ``add_bytes(...)`` per message, and ``end_round()`` for the record;
``meter.stop()`` at exit. Bytes or handshakes added outside a round count toward the next one. The record's fields
are listed in docs/meter.md; unknown figures are null, never guessed. Must not import the codec, transports,
algorithms or coordinator (the agent passes sizes and models in; pyzmq is never imported here).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedge.meter import flops as fl
from fedge.meter import zmtp
from fedge.meter.energy import EnergyIntegrator, EnergySource, Sampler
from fedge.meter.net import interface_counters, tcp_counters_to, wire_bytes_estimate
from fedge.meter.process import ContextWatch, PeakRss, cpu_clock
from fedge.meter.record import build_record, host_identity
from fedge.meter.sources import open_energy_source
from fedge.meter.sysfs import Root
from fedge.meter.window import PhaseTally, RoundWindow

DIRECTIONS: tuple[str, ...] = ("down", "up")
_PHASE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class AgentMeter:
    """Per-round meter of an edge agent: FLOPs, bytes, energy, CPU, memory, thermal context."""

    def __init__(self, energy: str | EnergySource = "auto", sysfs_root: str | Path = "/", sample_hz: float = 10.0,
                 *, vcgencmd: str = "vcgencmd", estimate: Mapping[str, Any] | None = None,
                 mechanism: zmtp.Mechanism = "NULL", iface: str | None = None,
                 proc_self: str | Path = "/proc/self") -> None:
        self.root = Root(sysfs_root)
        self.host = host_identity(str(self.root.path("/etc/machine-id")))
        self.mechanism = mechanism
        self.iface = iface
        self.source, self.energy_notes = open_energy_source(energy, self.root, vcgencmd, dict(estimate or {}))
        self.integrator = EnergyIntegrator(self.source) if self.source else None
        self.flops = fl.FlopCounter()
        self.rss = PeakRss(proc_self)
        self.context = ContextWatch(self.root)
        self.sampler = Sampler(sample_hz, [self.rss.sample, self.context.sample])
        if self.integrator is not None:
            integrator = self.integrator
            self.sampler.callbacks.insert(0, lambda: integrator.sample(force=False))
            integrator.sample()
        self.tcp_remote: tuple[str, int] | None = None
        self._round: RoundWindow | None = None
        self._pending: dict[str, float] = {}

    # lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background sampler (energy, RSS, temperatures, frequencies) at ``sample_hz``."""
        self.sampler.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop the sampler and join it; True when it ended within ``timeout`` seconds."""
        return self.sampler.stop(timeout)

    def __enter__(self) -> AgentMeter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def watch_tcp(self, remote: tuple[str, int] | None) -> None:
        """Read kernel TCP_INFO counters of this process's connections to ``remote`` (host, port) each round."""
        self.tcp_remote = remote

    def prepare_training(self, model: nn.Module, input_shape: Sequence[int], batch_sizes: Sequence[int],
                         input_dtype: torch.dtype | None = None) -> None:
        """Count forward+backward FLOPs for these batch sizes now (e.g. at start-up), so the one-off counting cost
        does not land inside the first round's CPU time and energy."""
        for size in set(batch_sizes):
            self.flops.forward_backward(model, input_shape, size, input_dtype)

    # per round -------------------------------------------------------------------------------------------------
    def begin_round(self, round_number: int) -> None:
        if self._round is not None:
            raise RuntimeError(f"round {self._round.number} is still open; call end_round() first")
        self.rss.take()
        self.context.take()
        counters = interface_counters(self.root).get(self.iface) if self.iface else None
        self._round = RoundWindow(
            number=int(round_number), t_start=time.time(), clock=cpu_clock(),
            energy=self.integrator.tally() if self.integrator else None,
            tcp=tcp_counters_to(self.tcp_remote) if self.tcp_remote else None,
            iface=(counters.rx_bytes, counters.tx_bytes) if counters else None,
            counts=dict(self._pending))
        self._pending = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure a phase (``receive``, ``decode``, ``train``, ``encode``, ``send`` or another short name):
        process CPU seconds, the calling thread's CPU seconds, wall time, peak RSS and energy. Phases may nest;
        a repeated phase adds up."""
        current = self._current()
        if not _PHASE_NAME.match(name):
            raise ValueError(f"phase names are short lowercase identifiers, got {name!r}")
        if name in current.open_phases:
            raise RuntimeError(f"phase {name!r} is already open")
        self._rss_boundary(current)
        current.open_phases[name] = 1
        energy = self.integrator.tally() if self.integrator else None
        start = cpu_clock()
        try:
            yield
        finally:
            end = cpu_clock()
            self._rss_boundary(current)
            del current.open_phases[name]
            stats = current.phases.setdefault(name, PhaseTally())
            stats.cpu_s += (end.user + end.system) - (start.user + start.system)
            stats.thread_s += end.thread - start.thread
            stats.wall_s += end.wall - start.wall
            if self.integrator is not None and energy is not None and stats.energy_j is not None:
                stats.energy_j += self.integrator.tally().joules - energy.joules
            else:
                stats.energy_j = None

    def add_training(self, model: nn.Module, input_shape: Sequence[int], batch_sizes: Sequence[int],
                     optimizer: str = "adam", momentum: float = 0.0, weight_decay: float = 0.0, *,
                     nesterov: bool = False, amsgrad: bool = False, updated_elements: int | None = None,
                     mask_claim: int | None = None, densities: Mapping[str, float] | None = None,
                     input_dtype: torch.dtype | None = None) -> None:
        """Add the FLOPs of local training: one entry of ``batch_sizes`` per optimizer step taken.

        ``updated_elements`` is the verified count of elements that changed (``flops.ParamSnapshot``), None meaning
        every trainable element; ``mask_claim`` the mask's own count (``flops.mask_elements``), kept for the check;
        ``densities`` (weight name -> fraction nonzero) enables the theoretical sparse fwd+bwd figure."""
        current = self._current()
        sizes = [int(size) for size in batch_sizes]
        touched = fl.trainable_elements(model)
        updated = touched if updated_elements is None else int(updated_elements)
        if not 0 <= updated <= touched:
            raise ValueError(f"updated_elements must be in [0, {touched}], got {updated}")
        if mask_claim is not None and updated > mask_claim:
            # (no figure in the note: params_updated and params_mask_claim hold them, and secure aggregation drops
            # the first, which is computed from the change)
            current.notes.append("the verified updated elements (params_updated) exceed the mask's claim "
                                 "(params_mask_claim; e.g. Adam moments moving masked weights)")
        per_element = fl.optimizer_flops_per_element(optimizer, momentum=momentum, weight_decay=weight_decay,
                                                     nesterov=nesterov, amsgrad=amsgrad)
        steps = len(sizes)
        train = current.training
        _add(train, "flops_fwd_bwd", self.flops.training(model, input_shape, sizes, input_dtype))
        _add(train, "flops_opt_executed", None if per_element is None else per_element * touched * steps)
        _add(train, "flops_opt_updated", None if per_element is None else per_element * updated * steps)
        theoretical = (self.flops.theoretical_sparse(model, input_shape, sizes, densities, input_dtype)
                       if densities is not None else None)
        _add(train, "flops_theoretical_sparse", theoretical)
        _add(train, "steps", steps)
        _add(train, "samples", sum(sizes))
        _add(train, "params_updated", updated)
        _add(train, "params_mask_claim", mask_claim)
        train["batch_size"] = max([train.get("batch_size") or 0, *sizes]) or None
        train.update(params_total=fl.total_elements(model), params_trainable=touched, optimizer=optimizer.lower(),
                     opt_flops_per_element=per_element)
        if per_element is None:
            current.notes.append(f"optimizer {optimizer!r} has no FLOP table entry")

    def add_bytes(self, direction: str, payload: int, frames: Sequence[int] | None = None,
                  mechanism: zmtp.Mechanism | None = None) -> None:
        """One message: ``payload`` encoded bytes, sent as wire ``frames`` (default: one frame of the payload)."""
        sizes = [int(payload)] if frames is None else [int(size) for size in frames]
        stream = zmtp.message_bytes(sizes, mechanism or self.mechanism)
        self._count(direction, {"bytes_payload": payload, "bytes_zmtp": stream, "messages": 1,
                                "frames": len(sizes), "bytes_wire_est": wire_bytes_estimate(stream)})

    def add_connection(self, socket_type: str = "DEALER", peer_type: str = "ROUTER", *, identity: bytes = b"",
                       peer_identity: bytes = b"", metadata: Mapping[str, bytes] | None = None,
                       peer_metadata: Mapping[str, bytes] | None = None, mechanism: zmtp.Mechanism | None = None,
                       curve_server: bool = False) -> None:
        """A (re)connection: adds both handshakes to the ZMTP bytes (this side's to "up")."""
        mine = zmtp.handshake_bytes(socket_type, identity=identity, metadata=metadata,
                                    mechanism=mechanism or self.mechanism, curve_server=curve_server)
        theirs = zmtp.handshake_bytes(peer_type, identity=peer_identity, metadata=peer_metadata,
                                      mechanism=mechanism or self.mechanism, curve_server=not curve_server)
        for direction, size in (("up", mine), ("down", theirs)):
            self._count(direction, {"bytes_zmtp": size, "bytes_handshake": size,
                                    "bytes_wire_est": wire_bytes_estimate(size)})

    def end_round(self) -> dict[str, Any]:
        """Close the round and return its record (flat: numbers, strings, nulls)."""
        current = self._current()
        self._rss_boundary(current)
        clock = cpu_clock()
        temp, zone, freq = self.context.take()
        tally = self.integrator.tally() if self.integrator else None
        tcp_after = tcp_counters_to(self.tcp_remote) if self.tcp_remote else None
        counters = interface_counters(self.root).get(self.iface) if self.iface else None
        self._round = None
        return build_record(self, current, clock, tally, tcp_after,
                            (counters.rx_bytes, counters.tx_bytes) if counters else None, temp, zone, freq)

    # helpers ---------------------------------------------------------------------------------------------------
    def energy_constants(self) -> str | None:
        return json.dumps(self.source.constants(), sort_keys=True) if self.source else None

    def _current(self) -> RoundWindow:
        if self._round is None:
            raise RuntimeError("no round is open; call begin_round(round_number) first")
        return self._round

    def _rss_boundary(self, current: RoundWindow) -> None:
        peak = self.rss.take()
        current.rss_peak = max(current.rss_peak, peak)
        for name in current.open_phases:
            stats = current.phases.setdefault(name, PhaseTally())
            stats.rss_peak = max(stats.rss_peak, peak)

    def _count(self, direction: str, values: Mapping[str, float]) -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        target = self._round.counts if self._round is not None else self._pending
        for key, value in values.items():
            name = f"{key}_{direction}"
            target[name] = target.get(name, 0) + value


def _add(target: dict[str, Any], key: str, value: float | None) -> None:
    """Accumulate; once a contribution is unknown (None) the sum stays unknown."""
    if key in target and target[key] is None:
        return
    target[key] = None if value is None else target.get(key, 0) + value


