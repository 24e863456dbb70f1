"""A round's metrics row whose test evaluation runs beside the next round, off the round's critical path.

Evaluating the global model on the coordinator's test set takes a while, and nothing else waits for it: the row of
round t can be written while round t+1 trains. ``DeferredRow`` takes the row (every field but the test metrics) and
a copy of the model(s) to evaluate, and evaluates them in a thread; ``finish()`` waits for it and returns the whole
row. The row also goes into round t's checkpoint, so that a coordinator that stops before the row was written
evaluates the checkpointed model (round t's own) when it resumes and writes the same row: nothing changes the
results, only when they are written. ``PendingRow`` is the session's one row in waiting: which rounds are
evaluated (``eval.every``), the row held, and writing it. One thread at a time; no sockets, no algorithms by name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]
Evaluator = Callable[[Arrays], dict[str, Any]]


def evaluate(evaluator: Evaluator, arrays: Arrays | None, pruned: Arrays | None) -> dict[str, Any]:
    """The test metrics of a global model on the coordinator's test set (and ``test_accuracy_pruned`` of a second
    one), and ``eval_s``, the time they took."""
    started = time.monotonic()
    row: dict[str, Any] = {}
    if arrays is not None:
        row.update({f"test_{name}": value for name, value in evaluator(arrays).items()}, eval_source="coordinator")
    if pruned is not None:
        row["test_accuracy_pruned"] = evaluator(pruned)["accuracy"]
    row["eval_s"] = time.monotonic() - started
    return row


def copied(arrays: Arrays | None) -> Arrays | None:
    return None if arrays is None else {name: np.array(value, copy=True) for name, value in arrays.items()}


class DeferredRow:
    """One round's metrics row, complete once its evaluation (in a thread, when ``arrays`` is given) is done."""

    def __init__(self, row: dict[str, Any], evaluator: Evaluator | None = None, arrays: Arrays | None = None,
                 pruned: Arrays | None = None) -> None:
        self.row = row
        self.metrics: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        if evaluator is not None and (arrays is not None or pruned is not None):
            self.thread = threading.Thread(target=self.run, args=(evaluator, copied(arrays), copied(pruned)),
                                           name=f"evaluate-round-{row.get('round')}", daemon=True)
            self.thread.start()

    def run(self, evaluator: Evaluator, arrays: Arrays | None, pruned: Arrays | None) -> None:
        try:
            self.metrics = evaluate(evaluator, arrays, pruned)
        except BaseException as exc:  # handed to the thread that waits for the row
            self.error = exc

    @property
    def waiting(self) -> bool:
        """The row waits for an evaluation (False: it is complete now)."""
        return self.thread is not None

    def finish(self) -> dict[str, Any]:
        """The whole row, once the evaluation is done (its error, if it failed, is raised here)."""
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error
        return {**self.row, **self.metrics}


class PendingRow:
    """metrics.jsonl's next row: at most one round's row waits for its evaluation, and ``flush`` writes it."""

    def __init__(self, every: int, rounds: int, evaluator: Evaluator | None,
                 write: Callable[[dict[str, Any]], None]) -> None:
        self.every, self.rounds, self.evaluator, self.write = every, rounds, evaluator, write
        self.held: DeferredRow | None = None

    def due(self, number: int) -> bool:
        """Round ``number`` is evaluated (every ``eval.every`` rounds and the last)."""
        return self.every > 0 and (number % self.every == 0 or number == self.rounds)

    def hold(self, row: dict[str, Any], number: int, arrays: Callable[[], Arrays | None],
             pruned: Callable[[], Arrays | None]) -> DeferredRow:
        """Hold round ``number``'s row; in an evaluated round, its test metrics on the coordinator's test set are
        computed in a thread from a copy of the models ``arrays()`` and ``pruned()`` return now."""
        if self.evaluator is None or not self.due(number):
            self.held = DeferredRow(row)
        else:
            self.held = DeferredRow(row, self.evaluator, arrays(), pruned())
        return self.held

    def flush(self) -> None:
        """Write the row held (waiting for its evaluation), if any."""
        if self.held is None:
            return
        row = self.held.finish()
        self.held = None
        self.write(row)
