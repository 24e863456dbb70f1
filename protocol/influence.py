"""Bounded influence: how much one device's update may weigh in the aggregate, and how far it may move the model.

Two bounds, both on by default (docs/robustness.md says what each costs):
- **The weight cap.** A device's claimed sample count is counted as at most ``cap``: fixed before round 1 (a local
  or simulated fleet: the largest shard the coordinator wrote; a bound fleet: ``robust.max_samples``) or, when
  neither is known, ``robust.cap_factor`` times the median claim of round 1, fixed from then on.
- **The norm bound.** Each update group's change (a model group: the upload minus the model the device was sent,
  ``ServerHalf.change_reference``; every other group and every sparse section: its values, which are already
  changes) is scaled down to at most ``robust.norm_factor`` times the median of the previous round's raw norms of
  that group (or to ``robust.norm_bound`` when set). Round 1, and the first round of each phase a server half names
  (``ServerHalf.influence_phase``: DSSA's dense and sparse rounds differ in scale), have no previous median: their
  updates are held and bounded by the round's own median, in client order, when the round closes.

Nothing a device sends is trusted here: the claim is clamped, the norms are measured on the decoded values. The
state that streaming needs (the cap, the medians and their phase) is small and goes into the checkpoint, so a
resumed session bounds the next round exactly as an uninterrupted one. Pure: numpy and the codec's tensor groups;
no torch, no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedge.codec import TensorGroup
from fedge.protocol.payload import MODEL_GROUP, Arrays, ClientUpdate, Payload


@dataclass(frozen=True)
class InfluenceLimits:
    """The ``[robust]`` settings the bounds read (validated by the coordinator's configuration)."""

    max_samples: int = 0      # the weight cap; 0: the fleet's largest shard, or derived from round 1's claims
    cap_factor: float = 3.0   # a derived cap: this times the median claim of round 1
    norm_factor: float = 1.5  # the norm bound: this times the previous round's median raw norm; 0: off (chosen by
    # measurement: docs/results/robustness.md)
    norm_bound: float = 0.0   # an absolute norm bound instead (> 0)

    @property
    def bounds_norm(self) -> bool:
        return self.norm_bound > 0 or self.norm_factor > 0


@dataclass(frozen=True)
class Bounded:
    """What the bounds did to one update: its claim and what was counted, each group's raw change norm and the
    factor its change was scaled by (1.0: untouched)."""

    client_id: str
    index: int
    claimed_samples: int
    counted_samples: int
    norms: Mapping[str, float]
    scales: Mapping[str, float]

    @property
    def capped(self) -> bool:
        return self.counted_samples < self.claimed_samples

    @property
    def clipped(self) -> bool:
        return any(scale < 1.0 for scale in self.scales.values())

    def record(self) -> dict[str, Any]:
        """clients.jsonl's fields of the bounds."""
        return {"claimed_samples": self.claimed_samples, "num_samples": self.counted_samples,
                "capped": self.capped, "clipped": self.clipped,
                "update_norms": {name: round(value, 6) for name, value in self.norms.items()},
                "clip_scales": {name: round(value, 6) for name, value in self.scales.items() if value < 1.0}}


def change_of(group: TensorGroup, reference: Arrays | None) -> list[np.ndarray]:
    """A group's change as float64 pieces: each dense float tensor minus its reference (when one is given for it),
    and the sparse section's values as they are."""
    return list(change_pieces(group, reference))


def change_pieces(group: TensorGroup, reference: Arrays | None) -> Iterator[np.ndarray]:
    """``change_of``'s pieces one at a time. Each is made in one pass: float32 operands are widened to float64
    inside the subtraction (the same bits as widening them first, without the two float64 copies)."""
    for name, array in group.dense.items():
        if array.dtype.kind != "f":
            continue
        if reference is not None and name in reference:
            yield np.subtract(np.ravel(array), np.ravel(reference[name]), dtype=np.float64)
        else:
            yield np.asarray(array, dtype=np.float64).ravel()
    if group.sparse is not None:
        yield np.asarray(group.sparse.values, dtype=np.float64)


def change_norm(group: TensorGroup, reference: Arrays | None) -> float:
    return math.sqrt(sum(float(np.dot(piece, piece)) for piece in change_pieces(group, reference)))


def scale_change(group: TensorGroup, reference: Arrays | None, scale: float) -> TensorGroup:
    """The group with its change scaled by ``scale`` (reference + scale * (value - reference)), in float32."""
    dense: dict[str, np.ndarray] = {}
    for name, array in group.dense.items():
        if array.dtype.kind != "f":
            dense[name] = array
            continue
        values = np.asarray(array, dtype=np.float64)
        if reference is not None and name in reference:
            base = np.asarray(reference[name], dtype=np.float64)
            dense[name] = (base + scale * (values - base)).astype(np.float32)
        else:
            dense[name] = (scale * values).astype(np.float32)
    sparse = group.sparse
    if sparse is not None:
        sparse = dataclasses.replace(sparse, values=(scale * sparse.values.astype(np.float64)).astype(np.float32))
    return dataclasses.replace(group, dense=dense, sparse=sparse)


def group_references(update: ClientUpdate, reference: Arrays | None) -> dict[str, Arrays | None]:
    """The reference of each group: the model group's is the model sent; every other group holds changes."""
    return {name: reference if name == MODEL_GROUP else None for name in update.payload.groups}


def raw_norms(update: ClientUpdate, reference: Arrays | None) -> dict[str, float]:
    references = group_references(update, reference)
    return {name: change_norm(group, references[name]) for name, group in update.payload.groups.items()}


class Influence:
    """The bounds of a session: the cap (0 until fixed), the previous round's median raw norm of each group and
    the phase it was measured in."""

    def __init__(self, limits: InfluenceLimits, cap: int = 0) -> None:
        self.limits = limits
        self.cap = cap or limits.max_samples
        self.medians: dict[str, float] = {}
        self.phase: str | None = None

    def holds(self, phase: str) -> bool:
        """Whether a round of this phase must hold its updates until it closes: the cap is not fixed yet, or the
        norm bound is relative and no median of this phase is known."""
        relative = self.limits.norm_bound <= 0 and self.limits.norm_factor > 0
        uncapped = not self.cap and self.limits.cap_factor > 0
        return uncapped or (relative and (phase != self.phase or not self.medians))

    def fix_cap(self, claims: Sequence[int]) -> None:
        """Fix a cap not known before round 1: ``cap_factor`` times the median of round 1's claims."""
        if not self.cap and self.limits.cap_factor > 0 and claims:
            self.cap = max(1, math.ceil(self.limits.cap_factor * float(np.median(np.asarray(claims, np.float64)))))

    def thresholds(self, medians: Mapping[str, float]) -> dict[str, float]:
        """Each group's norm bound given the medians it is relative to (an absolute bound for every group)."""
        if self.limits.norm_bound > 0:
            return {"*": self.limits.norm_bound}
        if self.limits.norm_factor <= 0:
            return {}
        return {name: self.limits.norm_factor * median for name, median in medians.items()}

    def bound(self, update: ClientUpdate, reference: Arrays | None, thresholds: Mapping[str, float],
              norms: Mapping[str, float] | None = None) -> tuple[ClientUpdate, Bounded]:
        """The update with its claim clamped to the cap and each group's change scaled into its bound (``norms``:
        its raw norms, when already measured)."""
        references = group_references(update, reference)
        norms = dict(norms) if norms is not None else raw_norms(update, reference)
        groups, scales = dict(update.payload.groups), {}
        for name, norm in norms.items():
            limit = thresholds.get(name, thresholds.get("*"))
            scale = 1.0 if limit is None or norm <= limit else (limit / norm if norm > 0 else 1.0)
            scales[name] = scale
            if scale < 1.0:
                groups[name] = scale_change(groups[name], references[name], scale)
        counted = min(update.num_samples, self.cap) if self.cap else update.num_samples
        record = Bounded(update.client_id, update.index, update.num_samples, counted, norms, scales)
        if counted == update.num_samples and not record.clipped:
            return update, record
        payload = Payload(groups=groups, meta=update.payload.meta)
        return dataclasses.replace(update, num_samples=counted, payload=payload), record

    def remember(self, phase: str, norms: Mapping[str, Sequence[float]]) -> None:
        """The raw norms of a closed round: the medians the next round of the same phase is bounded by."""
        if norms:
            self.medians = {name: float(np.median(np.asarray(values, np.float64))) for name, values in norms.items()}
            self.phase = phase

    def state(self) -> dict[str, Any]:
        return {"cap": self.cap, "medians": dict(self.medians), "phase": self.phase}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.cap = int(state.get("cap", 0)) or self.cap
        self.medians = {str(k): float(v) for k, v in dict(state.get("medians", {})).items()}
        phase = state.get("phase")
        self.phase = None if phase is None else str(phase)


class Quarantine:
    """Devices no longer selected: one whose update was clipped or refused ``after`` rounds in a row (0: never),
    until an operator clears it. Keyed by client id, which CurveZMQ binds to the device's key, so a device cannot
    leave by renaming itself. Checkpointed with the session."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.streaks: dict[str, int] = {}
        self.quarantined: dict[str, dict[str, Any]] = {}  # client id -> {"round": r, "reason": why}

    def note_round(self, number: int, reported: Sequence[str], bounded: Sequence[str],
                   refused: Sequence[str]) -> list[str]:
        """A closed round: devices whose update was clipped (``bounded``) or refused (``refused``) extend their
        streak, the others that reported end it. Returns the devices quarantined by this round."""
        if self.after <= 0:
            return []
        hit = set(bounded) | set(refused)
        for client_id in set(reported) - hit:
            self.streaks.pop(client_id, None)
        newly = []
        for client_id in sorted(hit):
            self.streaks[client_id] = self.streaks.get(client_id, 0) + 1
            if self.streaks[client_id] >= self.after and client_id not in self.quarantined:
                self.quarantined[client_id] = {
                    "round": number, "reason": f"{self.streaks[client_id]} rounds in a row clipped or refused"}
                newly.append(client_id)
        return newly

    def clear(self, client_id: str) -> bool:
        self.streaks.pop(client_id, None)
        return self.quarantined.pop(client_id, None) is not None

    def state(self) -> dict[str, Any]:
        return {"streaks": dict(self.streaks), "quarantined": {k: dict(v) for k, v in self.quarantined.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.streaks = {str(k): int(v) for k, v in dict(state.get("streaks", {})).items()}
        self.quarantined = {str(k): dict(v) for k, v in dict(state.get("quarantined", {})).items()}
