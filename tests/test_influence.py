"""Bounded influence (protocol.influence) on the one aggregation path: the weight cap, the norm bound on every
group, the held first round, order independence, the checkpointed state, and a run where nothing is bounded being
the unbounded run bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext
from fedge.codec import SparseSection, TensorGroup
from fedge.models import build, state_to_arrays
from fedge.protocol.influence import Influence, InfluenceLimits, change_norm
from fedge.protocol.server_half import aggregate_round
from fedge.simulation.inprocess import global_arrays, make_fleet, run_round
from tests.algo_helpers import SGD, TINY_MLP, client_data, same_arrays
from tests.influence_cases import attacker, distance, ef_update, server_and_uploads


def test_one_inflated_flipped_update_is_capped_and_clipped_and_the_model_stays_near_the_honest_mean() -> None:
    server, initial, honest = server_and_uploads()
    evil = attacker(initial, 5)
    clean, _, _ = server_and_uploads()
    aggregate_round(clean, 1, honest)
    unbounded, _, _ = server_and_uploads()
    aggregate_round(unbounded, 1, [*honest, evil])
    influence = Influence(InfluenceLimits())
    metrics = aggregate_round(server, 1, [evil, *honest], influence)  # round 1: held, then bounded
    claims = [u.num_samples for u in [*honest, evil]]
    assert influence.cap == int(np.ceil(3.0 * np.median(claims)))
    assert metrics["robust_capped"] == 1 and metrics["robust_clipped"] == 1
    honest_norms = [change_norm(u.payload.groups["model"], initial) for u in honest]
    median = float(np.median([*honest_norms, change_norm(evil.payload.groups["model"], initial)]))
    assert influence.medians["model"] == median
    # bounded: the attacker moves the honest mean by at most its capped weight times (its clipped change, 1.5
    # medians, plus the honest mean change, at most 1 median here); unbounded, by about 20 models
    weight = influence.cap / (influence.cap + sum(u.num_samples for u in honest))
    assert distance(server.model, clean.model) <= weight * (influence.limits.norm_factor + 1) * median * 1.01
    assert distance(unbounded.model, clean.model) > 50 * distance(server.model, clean.model)


def test_a_held_round_is_the_same_whatever_the_arrival_order_and_the_next_one_streams() -> None:
    results = []
    for order in (1, -1):
        server, initial, honest = server_and_uploads()
        influence = Influence(InfluenceLimits())
        updates = [*honest, attacker(initial, 5)][::order]
        aggregate_round(server, 1, updates, influence)
        second = [ClientUpdate(u.client_id, u.index, u.num_samples, Payload(groups={"model": TensorGroup(
            dense={k: (server.model[k] + 0.5 * (v - initial[k])).astype(np.float32)
                   for k, v in u.payload.groups["model"].dense.items()})})) for u in updates]
        assert not influence.holds("")  # round 2 is bounded by round 1's median as its updates arrive
        aggregate_round(server, 2, second, influence)
        results.append(server.model)
    assert same_arrays(results[0], results[1])


def test_every_group_is_bounded_on_its_own_and_sparse_values_count_as_changes() -> None:
    influence = Influence(InfluenceLimits(max_samples=50))
    names, shapes = ("w",), ((6,),)
    sparse = SparseSection.with_indices(names, shapes, np.array([1, 4]), np.array([30.0, 40.0], np.float32))
    update = ClientUpdate("a", 0, 80, Payload(groups={
        "delta": TensorGroup(dense={"b": np.array([0.3, 0.4], np.float32)}),
        "control": TensorGroup(sparse=sparse)}))
    bounded, record = influence.bound(update, None, influence.thresholds({"delta": 1.0, "control": 1.0}))
    assert record.counted_samples == 50 and record.capped
    assert record.norms == pytest.approx({"delta": 0.5, "control": 50.0}) and record.scales["delta"] == 1.0
    assert np.allclose(bounded.payload.groups["control"].sparse.values, [0.9, 1.2])  # norm 1.5 = 1.5 x median 1
    assert bounded.payload.groups["delta"] is update.payload.groups["delta"]


def test_the_bounds_state_survives_a_checkpoint() -> None:
    server, initial, honest = server_and_uploads()
    influence = Influence(InfluenceLimits())
    aggregate_round(server, 1, [*honest, attacker(initial, 5)], influence)
    resumed = Influence(InfluenceLimits())
    resumed.load_state(influence.state())
    assert resumed.state() == influence.state() and not resumed.holds("")
    assert Influence(InfluenceLimits()).holds("")  # a fresh one would hold round 2 again


def test_a_run_the_bounds_never_touch_is_the_unbounded_run_bit_for_bit() -> None:
    data = client_data(TINY_MLP, 4, samples=48)
    models = []
    for bounds in (None, InfluenceLimits()):
        fleet = make_fleet("fedavg", {}, TINY_MLP, clients=4, seed=3, bounds=bounds, weight_cap=48)
        touched = 0
        for round_number in (1, 2, 3):
            metrics = run_round(fleet, round_number, data, SGD, seed=3)
            touched += metrics.get("robust_clipped", 0) + metrics.get("robust_capped", 0)
        assert touched == 0
        models.append(global_arrays(fleet))
    assert same_arrays(models[0], models[1])


def test_robust_rules_ignore_a_minority_of_outliers_and_the_mean_does_not() -> None:
    from fedge.protocol.robust_rules import RobustRule, combine, krum_selection

    rng = np.random.default_rng(1)
    honest = [1.0 + 0.1 * rng.standard_normal(50) for _ in range(8)]
    outliers = [-30.0 * np.ones(50), -30.0 * np.ones(50)]
    rows = [*honest, *outliers]
    target = np.mean(honest, axis=0)
    assert np.linalg.norm(combine(RobustRule(), rows) - target) > 40
    for rule in (RobustRule("trimmed-mean", byzantine=2), RobustRule("median"), RobustRule("multi-krum", byzantine=2),
                 RobustRule("centered-clip", cc_tau=1.0, cc_iters=5)):
        assert np.linalg.norm(combine(rule, rows) - target) < 2.0, rule  # centred clipping: within f/n tau
    assert krum_selection(np.stack(rows), 2) == list(range(8))
    assert RobustRule("trimmed-mean", trim=0.2).aggregator == "trimmed-mean"
    assert np.allclose(combine(RobustRule("trimmed-mean", trim=0.0), rows), np.mean(rows, axis=0))


def test_a_robust_rule_on_the_aggregation_path_is_unweighted_and_the_same_in_any_order() -> None:
    from fedge.protocol.robust_rules import RobustRule

    models = []
    for order in (1, -1):
        server, initial, honest = server_and_uploads(honest=8)
        evil = [attacker(initial, 8), dataclasses.replace(attacker(initial, 9), client_id="evil-2")]
        metrics = aggregate_round(server, 1, [*honest, *evil][::order], Influence(InfluenceLimits()),
                                  RobustRule("multi-krum", byzantine=2))
        assert metrics["robust_aggregator"] == "multi-krum"
        models.append(server.model)
    clean, _, honest = server_and_uploads(honest=8)
    clean_uniform = {k: np.mean([u.payload.groups["model"].dense[k] for u in honest], axis=0) for k in clean.model}
    assert same_arrays(models[0], models[1])
    assert distance(models[0], clean_uniform) < 1e-5  # Krum kept the 8 honest updates and averaged them uniformly


def test_a_robust_aggregator_that_cannot_apply_is_refused_before_anything_is_written() -> None:
    from fedge.coordinator.config import ConfigError, load_config, validate

    for algorithm in ("scaffold", "dssa-scaffold", "pfedla", "fedbn"):
        with pytest.raises(ConfigError, match=f"cannot apply to algorithm '{algorithm}'"):
            validate(load_config(None, [f'algorithm.name="{algorithm}"', 'robust.aggregator="median"']))
    with pytest.raises(ConfigError, match="robust.aggregator must be one of"):
        validate(load_config(None, ['robust.aggregator="krum"']))
    with pytest.raises(ConfigError, match="uplink_keep < 1"):
        validate(load_config(None, ['algorithm.name="dssa-fedavg"', "algorithm.uplink_keep=0.5",
                                    'robust.aggregator="median"']))
    validate(load_config(None, ['algorithm.name="fedprox"', 'robust.aggregator="trimmed-mean"']))
    validate(load_config(None, ['algorithm.name="dssa-fedprox"', 'robust.aggregator="multi-krum"']))
    for rule in ("median", "trimmed-mean"):
        with pytest.raises(ConfigError, match="zero wherever fewer than half"):
            validate(load_config(None, [f'robust.aggregator="{rule}"']))  # the default algorithm is ef-fedprox
    validate(load_config(None, ['robust.aggregator="centered-clip"']))


def test_a_robust_rule_combines_dssa_sparse_rounds_on_their_shared_support() -> None:
    from fedge.protocol.robust_rules import RobustRule

    data = client_data(TINY_MLP, 4, samples=32)
    models = {}
    for name, rule in (("mean", None), ("median", RobustRule("median"))):
        fleet = make_fleet("dssa-fedavg", {"sparsity": 0.5, "warmup_rounds": 1}, TINY_MLP, clients=4, seed=2,
                           bounds=InfluenceLimits(), weight_cap=32, rule=rule)
        for round_number in (1, 2, 3):
            metrics = run_round(fleet, round_number, data, SGD, seed=2)
        assert metrics["dssa_sparse"] == 1 and metrics["robust_aggregator"] == name
        models[name] = global_arrays(fleet)
    assert not same_arrays(models["mean"], models["median"])


def test_multi_krum_combines_ef_updates_on_every_coordinate_and_keeps_what_each_device_holds() -> None:
    from fedge.algorithms.registry import make_server
    from fedge.protocol.robust_rules import RobustRule

    model = build(TINY_MLP, seed=0)
    initial = state_to_arrays(model)
    context = ServerContext(num_clients=7, layout=ModelLayout.of(model))
    rng = np.random.default_rng(3)
    servers = [make_server("ef-fedavg", {"keep": 1.0, "value_dtype": "f32"}, initial, context) for _ in range(2)]
    honest = [ef_update(servers[0], i, 0, rng, 0.01) for i in range(5)]
    evil = ef_update(servers[0], 5, 0, rng, 50.0)
    start = servers[0].layout.flat(servers[0].public)  # type: ignore[attr-defined]
    for server, order in zip(servers, (1, -1), strict=True):
        aggregate_round(server, 1, [*honest, evil][::order], rule=RobustRule("multi-krum", byzantine=1))
    krum = [s.layout.flat(s.evaluation_arrays()) - start for s in servers]  # type: ignore[attr-defined]
    dense = np.zeros((5, start.size))
    for row, update in zip(dense, honest, strict=True):
        row[update.payload.groups["update"].sparse.positions()] = update.payload.groups["update"].sparse.values
    assert np.array_equal(krum[0], krum[1])  # the same in any order
    assert np.max(np.abs(krum[0] - dense.mean(axis=0))) < 1e-6  # the honest five, each zero off its coordinates
    assert all(servers[0].model.believed(i)[0].name == "HOLDS" for i in range(6))  # type: ignore[attr-defined]
    # round 2: an update trained from the old public model joins no sum, and the rule still combines the others
    stale = ef_update(servers[0], 6, 0, rng, 0.01)
    metrics = aggregate_round(servers[0], 2, [*(ef_update(servers[0], i, 1, rng, 0.01) for i in range(6)), stale],
                              rule=RobustRule("centered-clip"))
    assert metrics["ef_stale_updates"] == 1 and metrics["ef_keyframe"] == 1  # six reported (one combined: none)
    assert servers[0].model.believed(6)[0].name == "HOLDS"  # type: ignore[attr-defined]


@pytest.mark.parametrize("value_dtype", ["f32", "f16", "bf16", "int8", "ternary"])
def test_compress_with_a_clip_sends_at_most_the_bound_and_the_residual_keeps_the_rest(value_dtype: str) -> None:
    from fedge.algorithms.sparse import FlatLayout, compress

    layout = FlatLayout(("w", "b"), ((40, 30), (30,)))
    update = np.random.default_rng(1).standard_normal(layout.size).astype(np.float32)
    free = compress(layout, update, 0.3, value_dtype)
    norm = float(np.linalg.norm(free.decoded.astype(np.float64)))
    loose = compress(layout, update, 0.3, value_dtype, clip=2 * norm)
    assert np.array_equal(loose.decoded, free.decoded) and np.array_equal(loose.residual, free.residual)
    clipped = compress(layout, update, 0.3, value_dtype, clip=norm / 4)
    sent = float(np.linalg.norm(clipped.decoded.astype(np.float64)))
    assert norm / 4 * 0.99 < sent <= norm / 4  # under the bound, and not far under it
    assert np.array_equal(clipped.indices, free.indices)
    kept = clipped.residual.copy()
    kept[clipped.indices] += clipped.decoded
    assert np.allclose(kept, update, atol=1e-6)  # what was not sent stays in the residual


def test_ef_devices_clip_to_the_bound_their_tasks_announce_so_the_coordinator_clips_none_of_them() -> None:
    data = client_data(TINY_MLP, 4, samples=32)
    clipped = []
    fleet = make_fleet("ef-fedavg", {"keep": 0.3, "value_dtype": "f16"}, TINY_MLP, clients=4, seed=1,
                       bounds=InfluenceLimits(norm_factor=0.5), weight_cap=32)
    for round_number in (1, 2, 3):
        metrics = run_round(fleet, round_number, data, SGD, seed=1)
        clipped.append(metrics["robust_clipped"])
        assert (fleet.clients[0].clip > 0) == (round_number > 1)  # round 1 holds: no bound to announce
    assert clipped[0] >= 2 and clipped[1:] == [0, 0]  # half the devices are above 0.5 x the median
    assert any(client.clip_scale() < 1 for client in fleet.clients)  # ... because they scaled themselves


def test_centred_clipping_of_one_iteration_streams_with_the_previous_rounds_radius() -> None:
    from fedge.protocol.robust_rules import RobustRule
    from fedge.protocol.server_half import Aggregation

    rule = RobustRule("centered-clip", cc_iters=1)
    models, expected = [], None
    for order in (1, -1):
        server, initial, honest = server_and_uploads(honest=6)
        influence = Influence(InfluenceLimits())
        aggregate_round(server, 1, honest, influence, rule)  # round 1 holds: its own median
        start = {k: v.copy() for k, v in server.model.items()}
        radius = influence.medians["model"]  # cc_tau = 1 times round 1's median norm
        rng = np.random.default_rng(5)
        second = [ClientUpdate(f"c{i}", i, 100 + 50 * i, Payload(groups={"model": TensorGroup(dense={
            k: (v + 0.01 * (1 + i) * rng.standard_normal(v.shape)).astype(np.float32) for k, v in start.items()})}))
            for i in range(6)]
        second.append(dataclasses.replace(attacker(start, 6), num_samples=100))
        aggregation = Aggregation(server, 2, influence, rule)
        assert aggregation.radii == {"model": radius}  # streams: nothing held
        for update in second[::order]:
            aggregation.fold(update)
            assert not aggregation.for_rule and not aggregation.held
        aggregation.close()
        models.append(server.model)
        changes = []
        for update in second:
            change = {k: update.payload.groups["model"].dense[k].astype(np.float64) - start[k] for k in start}
            norm = float(np.sqrt(sum(np.sum(c * c) for c in change.values())))
            changes.append({k: c * min(1.0, radius / norm) for k, c in change.items()})
        expected = {k: start[k] + np.mean([c[k] for c in changes], axis=0) for k in start}
    assert same_arrays(models[0], models[1])
    assert expected is not None and max(float(np.max(np.abs(models[0][k] - expected[k]))) for k in expected) < 1e-5
