"""ef-shared (``algorithms.ef_shared``): the coordinator publishes one support per round, its top estimates and the
coordinates that waited longest; every device sends its change with its residual on that support only, so that a
device's residual stays bounded (no coordinate waits more than ceil(N / r) rounds); an update off the round's support
is refused; a session moves a tenth of FedAvg's bytes with the support counted; a resumed coordinator publishes the
same supports."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedge import codec
from fedge.algorithms import ef_shared, make_client, make_server
from fedge.algorithms.base import ClientUpdate, LocalStats, ModelLayout, Payload, ServerContext
from fedge.algorithms.ef_meta import EfUpdate
from fedge.models import state_to_arrays
from fedge.simulation.inprocess import through_codec
from tests.simfleet import InProcessSessions, overrides, read_jsonl

OPTIONS = {"keep": 0.1, "value_dtype": "f32", "dense_rounds": 0}


def test_the_support_is_the_top_estimates_then_the_coordinates_that_waited_longest() -> None:
    score = np.zeros(1000, np.float32)
    score[[5, 50, 500]] = [3.0, -2.0, 1.0]
    age = np.zeros(1000, np.int64)
    age[[7, 70, 700, 999]] = [9, 9, 4, 1]
    mask = ef_shared.support_of(score, age, keep=0.01, explore=0.5, seed=1, round_number=3)  # k = 10, r = 5
    assert np.count_nonzero(mask) == 10
    assert mask[[5, 50, 500, 7, 70, 700, 999]].all()  # three scores (fewer than k - r), then the oldest four
    again = ef_shared.support_of(score, age, keep=0.01, explore=0.5, seed=1, round_number=3)
    other = ef_shared.support_of(score, age, keep=0.01, explore=0.5, seed=1, round_number=4)
    assert np.array_equal(mask, again) and not np.array_equal(mask, other)  # ties drawn by (seed, round)
    score[:] = np.arange(1000, dtype=np.float32)
    mask = ef_shared.support_of(score, age, keep=0.01, explore=0.5, seed=1, round_number=3)
    assert mask[[999, 998, 997, 996, 995, 7, 70, 700]].all()  # five top scores, then the oldest


def halves(clients: int, options: dict[str, object] | None = None
           ) -> tuple[nn.Module, ef_shared.Server, list[ef_shared.Client]]:
    torch.manual_seed(0)
    model = nn.Linear(100, 10)
    initial = state_to_arrays(model)
    options = OPTIONS if options is None else options
    server = make_server("ef-shared-fedavg", options, initial, ServerContext(clients, ModelLayout.of(model), seed=1))
    devices = [make_client("ef-shared-fedavg", options, index) for index in range(clients)]
    for device in devices:
        device.initial_model(initial)
    assert isinstance(server, ef_shared.Server) and all(isinstance(d, ef_shared.Client) for d in devices)
    return model, server, devices  # type: ignore[return-value]


def one_round(server: ef_shared.Server, devices: list[ef_shared.Client], round_number: int,
              changes: list[np.ndarray]) -> list[np.ndarray]:
    """Each device receives its task through the codec, moves its model by its change (a stand-in for training),
    sends its update through the codec; the coordinator folds and closes. Returns what each device sent, as the
    coordinator decoded it, on every coordinate."""
    sent_flat = []
    for index, (device, change) in enumerate(zip(devices, changes, strict=True)):
        task, _ = through_codec(server.downlink(round_number, index), "task", index)
        model = nn.Linear(100, 10)
        device.on_receive(round_number, task, model)
        with torch.no_grad():
            model.weight += torch.from_numpy(change[:1000].reshape(10, 100))
            model.bias += torch.from_numpy(change[1000:])
        sent, _ = through_codec(device.make_update(round_number, model, LocalStats(1, 10, 0.0, 0.1)), "update",
                                index)
        update = ClientUpdate(client_id=f"d{index}", index=index, num_samples=10, payload=sent)
        assert server.check_update(round_number, update) == ""
        server.fold(round_number, update)
        flat = np.zeros(server.layout.size, np.float32)
        section = sent.groups["update"].sparse
        assert section is not None
        flat[server.support(round_number)] = section.values
        sent_flat.append(flat)
    server.close_round(round_number)
    return sent_flat


def test_a_devices_residual_stays_bounded_over_50_rounds() -> None:
    """Four devices, each with its own steady drift plus noise on every coordinate (every coordinate moves every
    round, a tenth is sent): no coordinate waits more than ceil(N / r) rounds, and the largest residual of rounds
    41-50 is no larger than that of rounds 21-30 (it has stopped growing) and a few rounds' changes."""
    _, server, devices = halves(4)
    rng = np.random.default_rng(0)
    drifts = [rng.normal(0, 0.01, 1010).astype(np.float32) for _ in devices]
    size = server.layout.size
    count = codec.retained_count(size, keep=OPTIONS["keep"])
    longest = math.ceil(size / math.ceil(server.config.explore * count))
    norms = []
    moved = np.zeros(size, np.float64)  # device 0: all its changes, and all it sent
    sent = np.zeros(size, np.float64)
    for number in range(1, 51):
        changes = [d + rng.normal(0, 0.005, 1010).astype(np.float32) for d in drifts]
        sent += one_round(server, devices, number, changes)[0]
        moved += changes[0]
        assert int(server.age.max()) < longest, number
        norms.append(max(float(np.linalg.norm(d.residual)) for d in devices))  # type: ignore[arg-type]
    change = float(np.linalg.norm(drifts[0]))
    # error feedback loses nothing: what it sent and what it holds add up to what it moved
    assert np.allclose(sent + devices[0].residual, moved, atol=1e-4)  # type: ignore[operator]
    assert max(norms[40:]) <= max(norms[20:30]) and max(norms) < 10 * change, [round(n, 2) for n in norms]


def test_an_update_off_the_rounds_support_is_refused() -> None:
    _, server, devices = halves(3)
    one_round(server, devices, 1, [np.full(1010, 0.01, np.float32)] * 3)
    model = nn.Linear(100, 10)
    devices[0].on_receive(2, through_codec(server.downlink(2, 0), "task", 0)[0], model)
    payload = devices[0].make_update(2, model, LocalStats(1, 10, 0.0, 0.1))
    update = ClientUpdate(client_id="d0", index=0, num_samples=10, payload=payload)
    assert server.check_update(2, update) == ""
    group = payload.groups["update"]
    assert group.sparse is not None
    stale = server.support(1)  # last round's support: another CRC
    moved = codec.SparseSection.masked_values(group.sparse.names, group.sparse.shapes, stale,
                                              np.zeros(int(stale.sum()), np.float32), select=True)
    indexed = codec.SparseSection.with_indices(group.sparse.names, group.sparse.shapes,
                                               np.flatnonzero(server.support(2)), group.sparse.values)
    for section in (moved, indexed):
        forged = Payload(groups={"update": codec.TensorGroup(dense=dict(group.dense), sparse=section)},
                         meta=payload.meta)
        refusal = server.check_update(2, ClientUpdate(client_id="d0", index=0, num_samples=10, payload=forged))
        assert "round's published support" in refusal
    assert EfUpdate.from_meta(payload.meta).base == server.model.version


def test_a_resumed_coordinator_publishes_the_same_supports() -> None:
    _, server, devices = halves(3)
    rng = np.random.default_rng(2)
    for number in (1, 2, 3):
        one_round(server, devices, number, [rng.normal(0, 0.01, 1010).astype(np.float32) for _ in devices])
    arrays, meta = server.state_dict()
    _, resumed, _ = halves(3)
    resumed.load_state_dict(arrays, meta)
    assert np.array_equal(server.support(4), resumed.support(4))
    assert not np.array_equal(server.support(4), server.support(3))


def test_a_session_moves_a_tenth_of_fedavgs_bytes_with_its_supports_counted(
        sessions: InProcessSessions) -> None:
    rows = {}
    for name in ("fedavg", "ef-shared-fedprox"):
        extra = ("run.rounds=4", "algorithm.value_dtype=\"f16\"", "algorithm.dense_rounds=0") \
            if name != "fedavg" else ("run.rounds=4",)
        sessions.run(overrides(name, 1.0, "simulated", "inline", extra), name=name)
        rows[name] = read_jsonl(sessions.root / name / "metrics.jsonl")
    shared = rows["ef-shared-fedprox"]
    assert all(r["ef_support"] == shared[0]["ef_support"] > 0 for r in shared)
    for key in ("bytes_down", "bytes_up_tensors"):
        ratio = sum(r[key] for r in shared) / sum(r[key] for r in rows["fedavg"])
        assert ratio < 0.1, (key, ratio)
    assert shared[-1]["test_accuracy"] > 0.4


def test_a_securely_aggregated_mean_folds_on_the_support_and_tells_what_every_device_summed_holds() -> None:
    """Under secure aggregation no device's meta reaches the coordinator: the mean names the devices summed, and the
    half believes each holds the round's keyframe (else its next task would resend the chain from the start)."""
    from fedge.algorithms.keyframes import Belief
    from fedge.protocol.payload import DELTA_GROUP, SECURE_CONTRIBUTORS

    _, server, devices = halves(3)
    support = server.support(1)
    section = server.layout
    mean = codec.SparseSection.masked_values(section.names, section.shapes, support,
                                             np.full(int(support.sum()), 0.01, np.float32), select=True)
    server.downlink(1, 0)
    server.fold(1, ClientUpdate(client_id="d0", index=0, num_samples=1, payload=Payload(
        groups={DELTA_GROUP: codec.TensorGroup(sparse=mean)}, meta={SECURE_CONTRIBUTORS: [0, 2]})))
    server.close_round(1)
    assert [server.model.believed(i)[0] for i in range(3)] == [Belief.HOLDS, Belief.UNSYNCED, Belief.HOLDS]
    moved = server.layout.flat(server.evaluation_arrays()) - server.layout.flat(state_to_arrays(halves(3)[0]))
    assert np.allclose(moved[support], 0.01) and not moved[~support].any()


@pytest.mark.parametrize("value_dtype", ["f32", "f16", "ternary"])
def test_the_value_grid_clamps_and_rounds_what_is_sent_and_the_residual_keeps_what_it_moved(value_dtype: str
                                                                                             ) -> None:
    """Secure aggregation's grid clips every coordinate to its clip range and rounds it to its step at random:
    told the grid (``on_value_grid``), the device clamps and rounds what it sends itself and keeps the rest, so that
    nothing it moved is lost (CI's small-budget run lost 5 points when the grid clipped the accumulated residuals
    instead) and the sum's rounding has nothing left to draw, whatever the value encoding (a review found f16 and
    ternary values taken off the grid again)."""
    from fedge.secagg import field
    from fedge.secagg.encoding import grid_for, value_grid

    grid = grid_for(8, 0.004, [1010], 10)
    bound, step = value_grid({"clip": list(grid.clips), "levels": grid.levels})
    assert (bound, step) == (0.004, 0.004 / grid.levels)
    _, server, devices = halves(2, {**OPTIONS, "value_dtype": value_dtype})
    for device in devices:
        device.on_value_grid(1, bound, step)
    rng = np.random.default_rng(3)
    changes = [rng.normal(0, 0.01, 1010).astype(np.float32) for _ in devices]
    sent = one_round(server, devices, 1, changes)
    support = server.support(1)
    for flat, change, device in zip(sent, changes, devices, strict=True):
        assert np.abs(flat).max() == pytest.approx(0.004, rel=1e-6) and np.abs(change[support]).max() > 0.01
        on_grid = flat[support] / step
        assert np.abs(on_grid - np.rint(on_grid)).max() < 1e-4 and len(np.unique(np.rint(on_grid))) > 3
        assert np.allclose(flat + device.residual, change, atol=1e-6)  # type: ignore[operator]
        words = field.quantise(flat[support], 0.004, grid.levels, np.random.default_rng(0))
        assert np.array_equal(words, np.rint(on_grid).astype(np.int64))  # the sum's rounding draws nothing


def test_a_dense_first_round_estimates_every_coordinate_and_the_next_support_takes_the_largest() -> None:
    """``dense_rounds = 1``: round 1's support is every coordinate (nothing waits in a residual), and from round 2
    on the top part of the support is the coordinates whose mean change was largest."""
    torch.manual_seed(0)
    model = nn.Linear(100, 10)
    initial = state_to_arrays(model)
    options = {key: value for key, value in OPTIONS.items() if key != "dense_rounds"}  # the default: 1
    server = make_server("ef-shared-fedavg", options, initial, ServerContext(3, ModelLayout.of(model), seed=1))
    devices = [make_client("ef-shared-fedavg", options, index) for index in range(3)]
    for device in devices:
        device.initial_model(initial)
    assert isinstance(server, ef_shared.Server)
    assert server.support(1).all()
    rng = np.random.default_rng(4)
    changes = [rng.normal(0, 0.01, 1010).astype(np.float32) for _ in devices]
    one_round(server, devices, 1, changes)  # type: ignore[arg-type]
    assert all(np.abs(d.residual).max() < 1e-7 for d in devices)  # type: ignore[attr-defined, arg-type]
    size = server.layout.size
    count = codec.retained_count(size, keep=OPTIONS["keep"])
    top = count - math.ceil(server.config.explore * count)
    largest = np.argsort(-np.abs(np.mean(changes, axis=0)), kind="stable")[:top]
    support = server.support(2)
    assert np.count_nonzero(support) == count and support[largest].all()
    with pytest.raises(ValueError, match="dense_rounds"):
        make_server("ef-shared-fedavg", {**OPTIONS, "dense_rounds": -1}, initial,
                    ServerContext(3, ModelLayout.of(model), seed=1))


def test_a_norm_bound_on_the_grid_is_met_by_rounding_toward_zero() -> None:
    """Rounding to the nearest step can undo a scale that fit a norm bound (a review found the clip loop giving up
    with most values at the grid's edge); under a bound the device rounds toward zero, so no value grows."""
    from fedge.algorithms.sparse import FlatLayout, ValueGrid

    layout = FlatLayout.of({"w": np.zeros(1000, np.float32)}, ["w"])
    grid = ValueGrid(0.004, 0.004 / 12)
    update = np.random.default_rng(0).normal(0, 0.01, 1000).astype(np.float32)
    support = np.ones(1000, dtype=bool)
    nearest = float(np.linalg.norm(grid.rounded(grid.clamped(update)).astype(np.float64)))
    for fraction in (0.999, 0.99, 0.9):
        group, residual, scale = ef_shared.on_support(layout, support, update, "f32", {}, clip=nearest * fraction,
                                                      grid=grid)
        assert group.sparse is not None
        sent = np.asarray(group.sparse.values, np.float64)
        assert np.linalg.norm(sent) <= nearest * fraction and 0 < scale <= 1
        assert np.abs(sent / grid.step - np.rint(sent / grid.step)).max() < 1e-4
        assert np.allclose(sent + residual, update, atol=1e-6)
