"""A round's row whose evaluation runs beside the next round: it evaluates a copy of the model taken when the round
closed (the server half may move on meanwhile), hands an evaluation's failure to whoever waits for the row, and the
row's numpy figures survive the checkpoint's JSON."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fedge.coordinator.deferred import DeferredRow
from fedge.coordinator.rundir import plain


def test_the_row_is_evaluated_from_the_model_as_it_was_when_the_round_closed() -> None:
    go = threading.Event()

    def evaluator(arrays: dict[str, np.ndarray]) -> dict[str, float]:
        go.wait(10)
        return {"accuracy": float(arrays["w"].sum())}

    model = {"w": np.ones(4, dtype=np.float32)}
    row = DeferredRow({"round": 3, "bytes_down": 7}, evaluator, model, None)
    model["w"] += 1  # the next round changes the server half's model in place
    go.set()
    finished = row.finish()
    assert finished["test_accuracy"] == 4.0 and finished["eval_source"] == "coordinator"
    assert finished["round"] == 3 and finished["eval_s"] >= 0


def test_an_evaluation_that_fails_raises_when_the_row_is_wanted() -> None:
    def broken(arrays: dict[str, np.ndarray]) -> dict[str, float]:
        raise RuntimeError("the test set is gone")

    row = DeferredRow({"round": 1}, broken, {"w": np.zeros(2)}, None)
    with pytest.raises(RuntimeError, match="test set is gone"):
        row.finish()
    assert DeferredRow({"round": 2}).finish() == {"round": 2}  # nothing to evaluate: the row as it is


def test_numpy_figures_of_a_row_become_plain_json() -> None:
    row = {"round": np.int64(4), "train_loss": np.float32(0.5), "accepted": np.array([1, 2])}
    assert plain(row) == {"round": 4, "train_loss": 0.5, "accepted": [1, 2]}
