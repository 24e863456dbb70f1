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

import json
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fedge import codec
from fedge.coordinator.rundir import RunDir
from fedge.coordinator.sections import SecAggSection
from fedge.plumbing import load_arrays, save_arrays
from fedge.protocol.secure_device import SecureLayout
from fedge.protocol.secure_round import SecureRound
from fedge.secagg.encoding import Grid, grid_for, setup_of, task_settings
from fedge.secagg.graph import neighbourhoods, threshold_of

ATTEMPTS_FILE = "secagg.json"
SUM_FILE = "secagg-sum.npz"  # an unmasked round's mean change, until the round's checkpoint


class SessionSecAgg:
    """See the module docstring."""

    def __init__(self, section: SecAggSection, run_dir: RunDir) -> None:
        self.section = section
        self.run_dir = run_dir
        self.round: SecureRound | None = None
        self.grid: Grid | None = None
        self.layout: SecureLayout | None = None
        self.settings: dict[str, Any] = {}

    def next_attempt(self, number: int) -> int:
        """The attempt of round ``number`` to open now (0, or one past the last opened), written durably."""
        path = self.run_dir / ATTEMPTS_FILE
        last = json.loads(path.read_text()) if path.exists() else {}
        attempt = int(last["attempt"]) + 1 if last.get("round") == number else 0
        self.run_dir.write_json(ATTEMPTS_FILE, {"round": number, "attempt": attempt})
        return attempt

    def open(self, run_id: str, number: int, selected: Sequence[str], model: codec.TensorGroup,
             peer_of: Callable[[str], bytes | None], now: float) -> SecureRound:
        """Round ``number``'s secure stages over the ``selected`` devices, sent ``model`` (the round's model group:
        what their change is laid out by, ``protocol.secure_device.SecureLayout``)."""
        s = self.section
        layout = self.layout = SecureLayout.of(model)
        grid = self.grid = grid_for(s.bits, s.clip_range, layout.sizes, len(selected))
        attempt = self.next_attempt(number)
        self.settings = task_settings(grid, s.threshold, s.neighbours, secrets.randbits(62), attempt)
        setup = setup_of(run_id, number, self.settings, grid.size, layout.support)
        self.round = SecureRound(run_id, number, attempt, setup, list(selected), peer_of, s.stage_timeout_s, now)
        return self.round

    def min_inputs(self) -> int:
        """How many masked inputs the open round needs before over-selection may close it: n - k + t for n devices
        of degree k and threshold t, so that however the missing ones fall, every device keeps t neighbours whose
        input came (a target below it made every round fail its neighbourhood check)."""
        secure = self.round
        if secure is None:
            return 0
        selected = sorted(secure.machine.selected)
        graph = neighbourhoods(selected, self.section.neighbours, int(self.settings["seed"]))
        degree = min(len(neighbours) for neighbours in graph.values())
        return min(len(selected), len(selected) - degree + threshold_of(degree, self.section.threshold))

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

    def keep_sum(self, number: int, change: npt.NDArray[np.float64], contributors: Sequence[tuple[str, int]]) -> None:
        """Round ``number``'s unmasked mean change and its contributors (client id, index), written durably."""
        save_arrays(self.run_dir / SUM_FILE, {"mean": change},
                    {"round": number, "contributors": [list(c) for c in contributors], "record": self.record()})

    def kept_sum(self, number: int) -> tuple[npt.NDArray[np.float64], list[tuple[str, int]], dict[str, Any]] | None:
        """The kept sum of round ``number`` (the round a resumed session plays next), or None; one of an earlier
        round, whose checkpoint was written, is removed."""
        path = self.run_dir / SUM_FILE
        if not path.exists():
            return None
        change, meta = load_arrays(path)
        if int(meta["round"]) != number:
            path.unlink()
            return None
        return change["mean"], [(str(c), int(i)) for c, i in meta["contributors"]], dict(meta["record"])

    def drop_sum(self) -> None:
        (self.run_dir / SUM_FILE).unlink(missing_ok=True)

    def record(self) -> dict[str, Any]:
        """The round's fields of metrics.jsonl: its attempt, how many masked inputs were summed, and why it failed
        ('' when it did not)."""
        secure = self.round
        if secure is None:
            return {}
        return {"secagg_attempt": secure.attempt, "secagg_summed": len(secure.contributors),
                "secagg_failed": secure.failed or ("" if secure.done else "the round ended before its unmask stage")}

    def close(self) -> None:
        """The round is committed (its checkpoint written): its kept sum is no longer needed."""
        self.round, self.grid = None, None
        self.drop_sum()
