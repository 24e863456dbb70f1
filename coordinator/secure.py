"""A session's secure aggregation (``[secagg]``; docs/secure-aggregation.md): for each round, the grid its devices
quantise on, the ``secagg`` settings its tasks carry, the ``protocol.secure_round.SecureRound`` that runs its stages,
and, once its sum is unmasked, the survivors' mean change laid out as the model's tensors.

Attempts: the settings name the round's attempt (it enters every key the devices derive). Before a round's tasks go
out, its number and attempt are written durably to ``RUN/secagg.json``; a coordinator that restarts and opens the
same round again opens its next attempt, so its devices mask with fresh keys. An unmasked sum is written durably
(``RUN/secagg-sum.npz``: the mean change, who is in it and the round's fields) before it is folded, and removed once
the round's checkpoint is written: a coordinator that crashes in between applies it when it resumes (``kept_sum``)
instead of redoing the round, for a redo would train from the same model and a second sum of nearly the same inputs
over other devices would give one device's update away. The layout is the round's model group as the
server half sends it (``SecureLayout``: its dense float tensors, then a DSSA round's complement; a model with integer
buffers is refused by the plan). Must not import torch, a transport or an algorithm by name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fedge import codec
from fedge.coordinator.crashpoints import crash_point
from fedge.coordinator.distributed import SessionNoise
from fedge.coordinator.rundir import RunDir
from fedge.coordinator.sections import SecAggSection
from fedge.plumbing import load_arrays, save_arrays
from fedge.protocol.registry import AgentRegistry
from fedge.protocol.secure_device import SecureLayout
from fedge.protocol.secure_round import SecureRound
from fedge.protocol.server_half import Aggregation, ServerHalf
from fedge.secagg.aggregator import RoundStage
from fedge.secagg.distributed import NoisyGrid
from fedge.secagg.encoding import Grid, grid_for, setup_of, task_settings
from fedge.secagg.graph import neighbourhoods, threshold_of
from fedge.secagg.keys import support_digest

log = logging.getLogger("fedge.coordinator")

ATTEMPTS_FILE = "secagg.json"
SUM_FILE = "secagg-sum.npz"  # an unmasked round's mean change, until the round's checkpoint


def layout_digest(layout: SecureLayout, words: int) -> str:
    """What a kept sum is tied to (hex SHA-256): the layout's tensors (names and shapes), length and coordinates."""
    section = layout.section
    tensors = [*layout.dense, *(zip(section.names, section.shapes, strict=True) if section is not None else ())]
    described = json.dumps([[name, list(shape)] for name, shape in tensors]).encode()
    return hashlib.sha256(described + support_digest(layout.support, words)).hexdigest()


@dataclass(frozen=True)
class KeptSum:
    """A round's unmasked mean change as kept before its checkpoint: in the round's layout (``support``: its
    ``layout_digest``), with its contributors (client id, index at the time) and its metrics fields."""

    round: int
    change: npt.NDArray[np.float64]
    contributors: list[tuple[str, int]]
    record: dict[str, Any]
    support: str

    def groups(self, task: Mapping[str, codec.TensorGroup]) -> dict[str, codec.TensorGroup]:
        """The change as the uplink a device of the round would send, laid out by the round's task as the
        resumed server half sends it; ``ValueError`` (one line) when it does not fit (the configuration changed)."""
        layout = SecureLayout.of_task(task)
        if sum(layout.sizes) != self.change.size or layout_digest(layout, self.change.size) != self.support:
            raise ValueError(f"the sum kept for round {self.round} (secagg-sum.npz) does not fit the round's layout "
                             "any more: resume with the configuration it was made with (the algorithm's options)")
        return layout.groups(self.change)


def release_minimum(devices: Sequence[str], neighbours: int, graph_seed: int, threshold: float) -> int:
    """How many masked inputs a round needs before over-selection may close it: n - k + t for n devices of degree k
    and threshold t, so that however the missing ones fall, every device keeps t neighbours whose input came (a
    target below it made every round fail its neighbourhood check); under distributed noise, also the fewest
    inputs whose sum is learned (each device adds its share of the noise for that many)."""
    graph = neighbourhoods(devices, neighbours, graph_seed)
    degree = min(len(members) for members in graph.values())
    return min(len(devices), len(devices) - degree + threshold_of(degree, threshold))


class SessionSecAgg:
    """See the module docstring."""

    def __init__(self, section: SecAggSection, run_dir: RunDir, noise: SessionNoise | None = None) -> None:
        self.section = section
        self.run_dir = run_dir
        self.noise = noise  # privacy.mode = "distributed"
        self.round: SecureRound | None = None
        self.grid: Grid | NoisyGrid | None = None
        self.release = 0    # the inputs the open round needs before its sum is learned
        self.accounted: dict[str, Any] = {}  # the open round's privacy fields, once accounted
        self.layout: SecureLayout | None = None
        self.settings: dict[str, Any] = {}

    def next_attempt(self, number: int) -> int:
        """The attempt of round ``number`` to open now (0, or one past the last opened), written durably."""
        path = self.run_dir / ATTEMPTS_FILE
        last = json.loads(path.read_text()) if path.exists() else {}
        attempt = int(last["attempt"]) + 1 if last.get("round") == number else 0
        self.run_dir.write_json(ATTEMPTS_FILE, {"round": number, "attempt": attempt})
        return attempt

    def open(self, run_id: str, number: int, selected: Sequence[int], registry: AgentRegistry, server: ServerHalf,
             now: float) -> SecureRound:
        """Round ``number``'s secure stages over the ``selected`` clients, laid out by the model group the server
        half sends them (``protocol.secure_device.SecureLayout``); a device is reached at its current routing id."""
        s = self.section
        layout = self.layout = SecureLayout.of_task(server.downlink(number, selected[0]).groups)
        graph_seed = secrets.randbits(62)
        devices = [registry.by_index(i).client_id for i in selected]
        self.release = release_minimum(devices, s.neighbours, graph_seed, s.threshold)
        grid = self.grid = grid_for(s.bits, s.clip_range, layout.sizes, len(selected)) if self.noise is None else \
            self.noise.grid(s.bits, sum(layout.sizes), len(selected), self.release)
        attempt = self.next_attempt(number)
        self.settings = task_settings(grid, s.threshold, s.neighbours, graph_seed, attempt)
        setup = setup_of(run_id, number, self.settings, grid.words, layout.support)

        def peer_of(client_id: str) -> bytes | None:
            agent = registry.get(client_id)
            return agent.peer if agent is not None and agent.connected and agent.peer else None

        self.round = SecureRound(run_id, number, attempt, setup, devices, peer_of, s.stage_timeout_s, now,
                                 release=self.release if self.noise is not None else 0)
        return self.round

    def min_inputs(self) -> int:
        """How many masked inputs the open round needs before over-selection may close it (``release_minimum``)."""
        return self.release if self.round is not None else 0

    def noise_bounds(self) -> dict[str, float]:
        """The norm bounds a task under distributed noise announces: every device clips its whole change to the L2
        clip itself (an error-feedback residual keeps the rest), as the noisy grid would."""
        return {"*": self.noise.clip} if self.noise is not None else {}

    def task_fields(self, number: int) -> dict[str, Any]:
        """The ``secagg`` field of round ``number``'s tasks."""
        if self.round is None or self.round.number != number:
            return {}
        return {"secagg": self.settings}

    def mean_change(self) -> npt.NDArray[np.float64] | None:
        """The survivors' mean change in the round's layout, once the sum is unmasked (else None)."""
        secure, grid = self.round, self.grid
        total = secure.total() if secure is not None else None
        if secure is None or grid is None or total is None:
            return None
        return grid.mean(total, len(secure.contributors))

    def account_unmask(self) -> None:
        """Under distributed noise, once the round's unmask requests are about to go out (the sum can be computed
        from their answers): the round's line in the release log, fsynced, first. A round whose unmask then fails
        stays accounted (never fewer rounds accounted than sums that could have been learned)."""
        secure, grid = self.round, self.grid
        if self.noise is not None and isinstance(grid, NoisyGrid) and secure is not None and \
                secure.stage is RoundStage.UNMASK and not self.accounted:
            self.accounted = self.noise.account(secure.number, grid)

    def keep(self, run_id: str, index_of: Callable[[str], int]) -> None:
        """Right after the unmask stage summed the round: its mean change kept durably, tied to the run, the round
        and the layout (crash point ``unmasked`` just before: what the restart rule alone must cover)."""
        secure, change, layout = self.round, self.mean_change(), self.layout
        if secure is None or change is None or layout is None:
            return
        crash_point("unmasked", secure.number)
        contributors = sorted([c, index_of(c)] for c in secure.contributors)
        save_arrays(self.run_dir / SUM_FILE, {"mean": change}, {
            "run_id": run_id, "round": secure.number, "words": int(change.size),
            "support": layout_digest(layout, int(change.size)), "contributors": contributors,
            "record": self.record()})

    def fold(self, aggregation: Aggregation, number: int, index_of: Callable[[str], int]) -> dict[str, Any]:
        """The round's mean change folded once (``Aggregation.fold_secure_mean``, under its first contributor);
        a round whose sum could not be unmasked folds nothing and leaves the model as it was. Its metrics fields."""
        change, secure, layout = self.mean_change(), self.round, self.layout
        if change is not None and secure is not None and layout is not None:
            first = min((index_of(c), c) for c in secure.contributors)
            aggregation.fold_secure_mean(layout.groups(change), (first[1], first[0]),
                                         sorted(index_of(c) for c in secure.contributors))
        record = self.record()
        if record.get("secagg_failed"):
            log.warning("round %d: secure aggregation failed (%s); the model stays as it was", number,
                        record["secagg_failed"])
        return record

    def kept(self, run_id: str, number: int) -> KeptSum | None:
        """The sum kept for round ``number`` of run ``run_id`` (the round a resumed session plays next), or None;
        one of another run, or of an earlier round (its checkpoint was written), is removed."""
        path = self.run_dir / SUM_FILE
        if not path.exists():
            return None
        change, meta = load_arrays(path)
        if meta.get("run_id") != run_id or int(meta["round"]) != number:
            path.unlink()
            return None
        return KeptSum(number, change["mean"], [(str(c), int(i)) for c, i in meta["contributors"]],
                       dict(meta["record"]), str(meta["support"]))

    def drop_sum(self) -> None:
        (self.run_dir / SUM_FILE).unlink(missing_ok=True)

    def record(self) -> dict[str, Any]:
        """The round's fields of metrics.jsonl: its attempt, how many masked inputs were summed, and why it failed
        ('' when it did not)."""
        secure = self.round
        if secure is None:
            return {}
        failed = secure.failed or ("" if secure.done else "the round ended before its unmask stage")
        return {"secagg_attempt": secure.attempt, "secagg_summed": len(secure.contributors),
                "secagg_failed": failed, **self.accounted, **({"dp_released": False} if failed and self.accounted else {})}

    def close(self) -> None:
        """The round is committed (its checkpoint written): its kept sum is no longer needed."""
        self.round, self.grid, self.accounted = None, None, {}
        self.drop_sum()
