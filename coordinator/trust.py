"""A session's trust bookkeeping: the bounded influence and robust rule its rounds aggregate with, each device's
counts of capped, clipped and refused updates, the quarantine with its files (``coordinator.quarantine``), and
where a round that holds its updates keeps them (``coordinator.spill``).
``coordinator.session`` owns one and calls it at each round's start and close; the rules themselves are the
protocol's (``protocol.influence``, ``protocol.robust_rules``). Knows no transport and no algorithm.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fedge.coordinator.config import RobustSection
from fedge.coordinator.quarantine import QUARANTINE_FILE, take_clear_requests
from fedge.coordinator.rundir import RunDir
from fedge.coordinator.spill import Spill
from fedge.protocol.influence import Bounded, Influence, InfluenceLimits, Quarantine
from fedge.protocol.registry import AgentRegistry
from fedge.protocol.robust_rules import RobustRule

log = logging.getLogger("fedge.coordinator")


class SessionTrust:
    """See the module docstring. ``weight_cap``: the cap known before round 1 (0: ``robust.max_samples`` or
    derived from round 1's claims)."""

    def __init__(self, robust: RobustSection, weight_cap: int, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.influence = Influence(InfluenceLimits(robust.max_samples, robust.cap_factor, robust.norm_factor,
                                                   robust.norm_bound), cap=robust.max_samples or weight_cap)
        self.rule = RobustRule(robust.aggregator, robust.trim, robust.byzantine, robust.cc_tau, robust.cc_iters)
        self.quarantine = Quarantine(robust.quarantine_after)
        self.counts: dict[str, dict[str, int]] = {}  # client id -> {"capped", "clipped", "rejected": n}
        self.refused_round: set[str] = set()  # client ids whose update was refused (invalid) this round
        self.spill = Spill(run_dir.path / "spill")  # a held round's updates beyond its memory budget
        self.spill.clear()  # what an interrupted round left

    def state(self) -> dict[str, Any]:
        return {"influence": self.influence.state(), "bound_counts": self.counts,
                "quarantine": self.quarantine.state()}

    def load_state(self, meta: Mapping[str, Any]) -> None:
        self.influence.load_state(meta.get("influence", {}))
        self.counts = {str(k): {n: int(c) for n, c in v.items()} for k, v in meta.get("bound_counts", {}).items()}
        self.quarantine.load_state(meta.get("quarantine", {}))

    def counts_of(self, client_id: str) -> dict[str, int]:
        return self.counts.setdefault(client_id, {"capped": 0, "clipped": 0, "rejected": 0})

    def refused(self, client_id: str) -> None:
        """An update of a registered device was refused as invalid."""
        self.refused_round.add(client_id)
        self.counts_of(client_id)["rejected"] += 1

    def report(self) -> dict[str, Any]:
        """report.json's ``weight_cap`` and ``robust``."""
        return {"weight_cap": self.influence.cap or None,
                "robust": {"capped": sum(c["capped"] for c in self.counts.values()),
                           "clipped": sum(c["clipped"] for c in self.counts.values()),
                           "by_agent": self.counts, "norm_medians": self.influence.medians}}

    def note_round(self, number: int, bounded: Sequence[Bounded], unit: str = "round") -> dict[int, dict[str, Any]]:
        """What the bounds did this round: clients.jsonl's fields by client index, each device's counters, and one
        warning line naming (at most 10 of) the devices capped or clipped; ``unit``: what the log lines call the
        round ("version" in an asynchronous session)."""
        if self.spill.spilled:
            log.info("%s %d: %d held update(s) (%.0f MB) waited on disk for its bounds", unit, number,
                     self.spill.spilled, self.spill.spilled_bytes / 1e6)
        self.spill.clear()
        bounds: dict[int, dict[str, Any]] = {}
        touched: list[str] = []
        for record in bounded:
            bounds[record.index] = record.record()
            if record.capped or record.clipped:
                counts = self.counts_of(record.client_id)
                counts["capped"] += int(record.capped)
                counts["clipped"] += int(record.clipped)
                what = [f"claimed {record.claimed_samples} samples, counted {record.counted_samples}"] * \
                    record.capped + [f"clipped ({', '.join(f'{g} x{s:.3g}' for g, s in record.scales.items() if s < 1)})"
                                     ] * record.clipped
                touched.append(f"{record.client_id}: {'; '.join(what)}")
        if touched:
            log.warning("%s %d: bounded %d update(s): %s%s", unit, number, len(touched), " | ".join(touched[:10]),
                        f" | and {len(touched) - 10} more" if len(touched) > 10 else "")
        reported = [r.client_id for r in bounded]
        clipped = [r.client_id for r in bounded if r.clipped]
        newly = self.quarantine.note_round(number, reported, clipped, sorted(self.refused_round))
        for client_id in newly:
            log.warning("%s %d: agent %s quarantined (%s): it is no longer selected; `coordinator quarantine %s "
                        "--clear %s` lets it back", unit, number, client_id, self.quarantine.quarantined[client_id]["reason"],
                        self.run_dir.path, client_id)
        if newly or self.quarantine.after:
            self.write_quarantine()
        self.refused_round = set()
        return bounds

    def write_quarantine(self) -> None:
        self.run_dir.write_json(QUARANTINE_FILE, {"after": self.quarantine.after, **self.quarantine.state()})

    def selectable(self, live: list[int], registry: AgentRegistry, minimum: int) -> list[int]:
        """The live clients a round may select: the quarantined left out, unless that leaves fewer than
        ``round.min_clients`` (then the session says so and leaves them in). Clear requests are read first. Called
        at each round's start."""
        self.refused_round = set()
        for client_id in take_clear_requests(self.run_dir.path):
            if self.quarantine.clear(client_id):
                log.warning("agent %s released from quarantine by the operator", client_id)
                self.write_quarantine()
        if not self.quarantine.quarantined:
            return live
        held = {registry.agents[c].index for c in self.quarantine.quarantined if c in registry.agents}
        kept = [i for i in live if i not in held]
        if len(kept) < minimum:
            log.warning("quarantine would leave %d live client(s), below round.min_clients = %d: the quarantined "
                        "are selected too this round", len(kept), minimum)
            return live
        return kept
