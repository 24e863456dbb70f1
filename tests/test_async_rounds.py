"""Asynchronous buffered rounds (docs/protocol.md, "Asynchronous rounds"): the protocol's rules, the staleness-weighted
fold, and the in-process driver on the simulated clock: its equivalence with synchronous rounds, bit for bit, and
its determinism."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedge.algorithms import fedavg
from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext
from fedge.codec import TensorGroup
from fedge.models import build, state_to_arrays
from fedge.protocol.asynchronous import (
    Arrival,
    AsyncRounds,
    AsyncSettings,
    Refusal,
    TaskPhase,
    staleness_weight,
)
from fedge.protocol.server_half import aggregate_round
from fedge.protocol.states import Transition
from fedge.simulation.asynchronous import run_async, run_sync
from fedge.simulation.inprocess import global_arrays, make_fleet, run_round
from fedge.simulation.timing import DeviceTiming
from tests.algo_helpers import ADAM, TINY_CNN_BN, TINY_MLP, client_data, same_arrays
from tests.benchmark_scripts import run_script


# ---------------------------------------------------------------------------------------------- the rules
def test_staleness_weights_are_fedbuffs_and_a_settings_mistake_is_one_line() -> None:
    assert [staleness_weight(t, "sqrt") for t in (0, 3, 8)] == [1.0, 0.5, 1 / 3]
    assert staleness_weight(7, "constant") == 1.0
    with pytest.raises(ValueError, match="negative"):
        staleness_weight(-1, "sqrt")
    for bad, match in (({"buffer": 0}, "buffer"), ({"max_staleness": -1}, "max_staleness"),
                       ({"staleness": "linear"}, "staleness must be one of"), ({"normalize": "mean"}, "normalize")):
        with pytest.raises(ValueError, match=match) as error:
            AsyncSettings(**bad)
        assert "\n" not in str(error.value)


def test_staleness_is_the_version_at_fold_minus_the_tasks_base_and_the_limit_is_inclusive() -> None:
    rounds = AsyncRounds(AsyncSettings(concurrency=3, buffer=1, max_staleness=2))
    t0, t1, t2 = (rounds.dispatch(i, 0.0) for i in range(3))  # base 0
    assert rounds.arrive(t0.task_id, 0) == Arrival(t0.task_id, 0, 0, 1.0, 1.0)
    rounds.flush()                    # version 1
    arrived = rounds.arrive(t1.task_id, 1)
    assert isinstance(arrived, Arrival) and arrived.staleness == 1 and arrived.discount == 1 / math.sqrt(2)
    assert arrived.counted == 1.0     # normalize "count": the divisor keeps the undiscounted weight
    rounds.flush()                    # version 2
    t3 = rounds.dispatch(0, 2.0)      # base 2
    at_limit = rounds.arrive(t2.task_id, 2)
    assert isinstance(at_limit, Arrival) and at_limit.staleness == 2  # max_staleness itself is accepted
    assert rounds.flush().cancelled == ()  # version 3: t3 is 1 behind
    t4, t5 = rounds.dispatch(1, 3.0), rounds.dispatch(2, 3.0)  # base 3: faster devices lap t3
    rounds.arrive(t4.task_id, 1)
    assert rounds.flush().cancelled == ()  # version 4: t3 is 2 behind, still within reach
    rounds.arrive(t5.task_id, 2)
    flush = rounds.flush()            # version 5: t3 (base 2) is 3 behind: cancelled
    assert [t.task_id for t in flush.cancelled] == [t3.task_id] and t3.phase is TaskPhase.CANCELLED
    late = rounds.arrive(t3.task_id, 0)  # its update crossed the Cancel
    assert isinstance(late, Refusal) and "not in flight" in late.reason


def test_an_update_staler_than_allowed_is_refused_with_its_reason() -> None:
    rounds = AsyncRounds(AsyncSettings(concurrency=2, buffer=1, max_staleness=1, normalize="weight"))
    old = rounds.dispatch(0, 0.0)
    quick = rounds.dispatch(1, 0.0)
    assert isinstance(rounds.arrive(quick.task_id, 1), Arrival)
    assert rounds.flush().cancelled == ()  # version 1: old is 1 behind, within reach
    rounds.in_flight[old.task_id].base = -1  # as if 2 behind: a flush cancels such a task; arrival refuses it too
    refused = rounds.arrive(old.task_id, 0)
    assert isinstance(refused, Refusal) and "2 versions stale" in refused.reason and "max_staleness is 1" in refused.reason
    assert old.phase is TaskPhase.REFUSED
    with pytest.raises(Transition):
        old.move("accept")            # a refused task cannot be accepted after all


def test_a_task_answered_by_another_client_or_twice_is_refused() -> None:
    rounds = AsyncRounds(AsyncSettings(concurrency=2, buffer=5, normalize="weight"))
    task = rounds.dispatch(0, 0.0)
    wrong = rounds.arrive(task.task_id, 1)
    assert isinstance(wrong, Refusal) and "sent to client 0" in wrong.reason
    assert isinstance(rounds.arrive(task.task_id, 0), Arrival)
    twice = rounds.arrive(task.task_id, 0)
    assert isinstance(twice, Refusal) and "not in flight" in twice.reason
    with pytest.raises(RuntimeError, match="already holds"):
        rounds.dispatch(1, 0.0) and rounds.dispatch(1, 0.0)


def test_a_version_takes_exactly_buffer_updates() -> None:
    rounds = AsyncRounds(AsyncSettings(concurrency=3, buffer=2))
    tasks = [rounds.dispatch(i, 0.0) for i in range(3)]
    for task in tasks[:2]:
        rounds.arrive(task.task_id, task.index)
    with pytest.raises(RuntimeError, match="flush it first"):
        rounds.arrive(tasks[2].task_id, 2)  # a driver that read on past the K-th update
    assert len(rounds.flush().arrivals) == 2 and isinstance(rounds.arrive(tasks[2].task_id, 2), Arrival)


def test_no_task_is_sent_that_could_only_be_refused() -> None:
    """With max_staleness 0 a version takes ``buffer`` updates: once that many are in flight or buffered, nothing more
    is sent until the flush, however much concurrency is left."""
    rounds = AsyncRounds(AsyncSettings(concurrency=10, buffer=3, max_staleness=0))
    tasks = [rounds.dispatch(i, 0.0) for i in range(3)]
    assert rounds.room() == 0
    assert isinstance(rounds.arrive(tasks[0].task_id, 0), Arrival)
    assert rounds.room() == 0         # one buffered, two in flight: the version is spoken for
    for task in tasks[1:]:
        rounds.arrive(task.task_id, task.index)
    rounds.flush()
    assert rounds.room() == 3
    wide = AsyncRounds(AsyncSettings(concurrency=4, buffer=1, max_staleness=5))
    assert wide.room() == 4           # concurrency binds when staleness leaves room


def test_the_state_survives_a_checkpoint_as_json() -> None:
    import json

    rounds = AsyncRounds(AsyncSettings(concurrency=3, buffer=2, max_staleness=1))
    a, b = rounds.dispatch(0, 0.5), rounds.dispatch(1, 0.7)
    rounds.arrive(a.task_id, 0)
    restored = AsyncRounds.restored(rounds.settings, json.loads(json.dumps(rounds.state())))
    assert restored.state() == rounds.state()
    assert restored.arrive(b.task_id, 1) == rounds.arrive(b.task_id, 1)
    assert restored.flush() == rounds.flush()


# ---------------------------------------------------------------------------------------------- the fold
def deltas_server(seed: int = 0):  # type: ignore[no-untyped-def]
    model = build(TINY_MLP, seed=seed)
    initial = state_to_arrays(model)
    server = fedavg.Server(fedavg.Config(upload="delta"), initial,
                           ServerContext(num_clients=3, layout=ModelLayout.of(model)))
    rng = np.random.default_rng(seed)
    deltas = [{k: rng.standard_normal(v.shape).astype(np.float32) if v.dtype.kind == "f" else v
               for k, v in initial.items()} for _ in range(3)]
    return server, initial, deltas


@pytest.mark.parametrize("normalize", ["count", "weight"])
def test_a_stale_delta_counts_its_discount_and_the_divisor_follows_normalize(normalize: str) -> None:
    server, initial, deltas = deltas_server()
    sizes, staleness = [10, 30, 60], [0, 3, 8]
    discounts = [staleness_weight(t, "sqrt") for t in staleness]
    counted = [1.0] * 3 if normalize == "count" else discounts
    updates = [ClientUpdate(f"c{i}", i, n, Payload(groups={"delta": TensorGroup(dense=d)}), discount=s, counted=c)
               for i, (d, n, s, c) in enumerate(zip(deltas, sizes, discounts, counted, strict=True))]
    aggregate_round(server, 1, updates)
    divisor = sum(n * c for n, c in zip(sizes, counted, strict=True))
    for name, value in initial.items():
        if value.dtype.kind != "f":
            continue
        change = sum(n * s * d[name].astype(np.float64) for d, n, s in zip(deltas, sizes, discounts, strict=True))
        assert np.allclose(server.model[name], value + change / divisor, atol=1e-6), name
    # and the same bits whatever order the updates were folded in
    again, _, _ = deltas_server()
    aggregate_round(again, 1, list(reversed(updates)))
    assert same_arrays(again.model, server.model)


@pytest.mark.parametrize("normalize", ["count", "weight"])
def test_efs_flat_mean_takes_the_discount_and_its_divisor_follows_normalize_in_any_order(normalize: str) -> None:
    """ef's fold (``FlatMean``): sum w_i s_i v_i / sum w_i c_i, exactly, whatever order the updates come in."""
    from fedge.algorithms.accumulate import FlatMean

    rng = np.random.default_rng(7)
    values = [rng.standard_normal(5).astype(np.float32) for _ in range(3)]
    at = [np.array([0, 2, 4]), np.array([1, 2, 3]), np.array([0, 1, 4])]
    sizes, discounts = [10.0, 30.0, 60.0], [staleness_weight(t, "sqrt") for t in (0, 3, 8)]
    counted = [1.0] * 3 if normalize == "count" else discounts
    means = []
    for order in ([0, 1, 2], [2, 0, 1]):
        folding = FlatMean(5)
        for i in order:
            folding.add(values[i][at[i]], at[i], sizes[i], discount=discounts[i], counted=counted[i])
        means.append(folding.mean())
    expected = np.zeros(5)
    for v, p, n, s in zip(values, at, sizes, discounts, strict=True):
        expected[p] += n * s * v[p].astype(np.float64)
    expected /= sum(n * c for n, c in zip(sizes, counted, strict=True))
    assert np.allclose(means[0], expected, rtol=1e-12) and means[0].tobytes() == means[1].tobytes()


# ---------------------------------------------------------------------------------------------- the driver
@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_async_with_one_cohort_a_version_and_no_staleness_is_the_synchronous_run_bit_for_bit(name: str) -> None:
    """concurrency = buffer = the cohort, max_staleness 0, constant staleness, server lr 1, delta uploads."""
    data = client_data(TINY_CNN_BN, 4, samples=32)
    sync = make_fleet(name, {"upload": "delta"}, TINY_CNN_BN, clients=4, seed=2)
    expected = []
    for number in (1, 2, 3):
        run_round(sync, number, data, ADAM, seed=2)
        expected.append(global_arrays(sync))
    fleet = make_fleet(name, {"upload": "delta"}, TINY_CNN_BN, clients=4, seed=2)
    timeline = run_async(fleet, AsyncSettings(concurrency=4, buffer=4, max_staleness=0, staleness="constant"), data,
                         ADAM, DeviceTiming(seed=1), versions=3, seed=2,
                         evaluate=lambda arrays: {"model": {k: v.copy() for k, v in arrays.items()}})
    assert [row["round"] for row in timeline.rows] == [1, 2, 3]
    for row, model in zip(timeline.rows, expected, strict=True):
        assert row["updates"] == 4 and row["staleness_max"] == 0 and row["refused"] == 0
        assert same_arrays(row["model"], model)


def async_run(seed: int, timing_seed: int, versions: int = 5):  # type: ignore[no-untyped-def]
    data = client_data(TINY_MLP, 5, samples=32)
    fleet = make_fleet("fedavg", {"upload": "delta"}, TINY_MLP, clients=5, seed=seed)
    timeline = run_async(fleet, AsyncSettings(concurrency=3, buffer=2, max_staleness=2), data, ADAM,
                         DeviceTiming(seed=timing_seed, speed_sigma=1.0), versions=versions, seed=seed)
    return global_arrays(fleet), timeline


def test_a_simulated_async_run_is_the_same_bit_for_bit_for_the_same_seed() -> None:
    first, timeline = async_run(1, 1)
    second, again = async_run(1, 1)
    assert same_arrays(first, second)
    assert timeline.rows == again.rows and timeline.clients == again.clients
    assert max(row["staleness_max"] for row in timeline.rows) >= 1  # the run did exercise staleness
    other, elsewhere = async_run(1, 2)  # other device speeds: other arrivals, another model
    assert [c["client"] for c in elsewhere.clients] != [c["client"] for c in timeline.clients]
    assert not same_arrays(first, other)


def test_sync_rounds_on_the_simulated_clock_last_as_long_as_their_slowest_kept_device() -> None:
    data = client_data(TINY_MLP, 6, samples=32)
    timing = DeviceTiming(seed=3, speed_sigma=1.0, jitter_sigma=0.0, step_s=1.0)
    plain = run_sync(make_fleet("fedavg", {}, TINY_MLP, clients=6, seed=0), 2, data, ADAM, timing, cohort=3)
    over = run_sync(make_fleet("fedavg", {}, TINY_MLP, clients=6, seed=0), 2, data, ADAM, timing, cohort=3,
                    selected=5)
    steps = 2  # 32 samples in batches of 16
    first = [c for c in plain.clients if c["round"] == 1]
    assert plain.rows[0]["sim_time_s"] == pytest.approx(max(steps / timing.speed(c["client"]) for c in first))
    assert over.rows[0]["cancelled"] == 2 and over.rows[0]["updates"] == 3
    kept = {c["client"] for c in over.clients if c["round"] == 1}
    assert all(steps / timing.speed(i) <= over.rows[0]["sim_time_s"] + 1e-9 for i in kept)
    with pytest.raises(ValueError, match="cohort"):
        run_sync(make_fleet("fedavg", {}, TINY_MLP, clients=6, seed=0), 1, data, ADAM, timing, cohort=4, selected=3)


def test_the_benchmark_runs_every_variant_and_prints_its_table(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert run_script("async_rounds", "--quick", "--out", str(tmp_path)) == 0
    out = capsys.readouterr()
    assert out.err.count(" rows, ") == 6  # each variant played (and said so on stderr)
    for variant in ("sync", "sync-over", "sync-latency", "fedasync", "fedbuff"):
        assert f"| {variant} |" in out.out
        assert (tmp_path / f"mlp-c4-s1-{variant}-seed0.json").exists()
    assert run_script("async_rounds", "--quick", "--out", str(tmp_path)) == 0
    again = capsys.readouterr()
    assert again.out.split("{")[0] == out.out.split("{")[0] and "rows" not in again.err  # resumed, not rerun


def test_the_latency_policy_on_the_simulated_clock_draws_slow_devices_less_often() -> None:
    """The session's own latency selection, fed the round times the simulated clock gives: over many rounds the
    slowest devices are drawn less often than under the uniform policy."""
    data = client_data(TINY_MLP, 12, samples=16)
    timing = DeviceTiming(seed=5, speed_sigma=1.5, jitter_sigma=0.0)
    counts = {}
    for policy in ("uniform", "latency"):
        fleet = make_fleet("fedavg", {}, TINY_MLP, clients=12, seed=0)
        timeline = run_sync(fleet, 25, data, ADAM, timing, cohort=4, seed=1, policy=policy)
        slowest = sorted(range(12), key=timing.speed)[:3]
        counts[policy] = sum(1 for c in timeline.clients if c["client"] in slowest)
    assert counts["latency"] < counts["uniform"], counts
