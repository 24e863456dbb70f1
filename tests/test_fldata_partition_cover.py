"""Every partition is a function of its seed and hands each training sample to exactly one client."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.fldata import PARTITIONERS, ClientShard, DataError, Dataset, partition
from fedge.fldata.schemes import split_indices

SCHEMES = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.3}),
    ("classes", {"classes_per_client": 3}),
    ("classes", {"classes_layout": "chain"}),
    ("dominant", {}),
    ("feature-shift", {}),
]


def numbered(n: int = 3000, n_test: int = 500, classes: int = 10, seed: int = 0) -> Dataset:
    """Images whose first three pixels spell their own index, so a shard says which samples it holds."""
    rng = np.random.default_rng(seed)

    def images(count: int) -> np.ndarray:
        x = rng.integers(0, 256, (count, 1, 4, 4), dtype=np.uint8)
        idx = np.arange(count)
        x[:, 0, 0, 0], x[:, 0, 0, 1], x[:, 0, 0, 2] = idx & 255, (idx >> 8) & 255, idx >> 16
        return x

    return Dataset(name="numbered", train_x=images(n), train_y=rng.integers(0, classes, n),
                   test_x=images(n_test), test_y=rng.integers(0, classes, n_test), num_classes=classes,
                   mean=(0.5,), std=(0.25,))


def held(shard: ClientShard) -> np.ndarray:
    x = shard.train_x[:, 0, 0].astype(np.int64)
    return x[:, 0] + 256 * x[:, 1] + 65536 * x[:, 2]


def test_all_schemes_are_listed() -> None:
    assert set(PARTITIONERS) == {name for name, _ in SCHEMES}


@pytest.mark.parametrize(("scheme", "options"), [s for s in SCHEMES if s[0] != "feature-shift"])
def test_every_sample_exactly_once(scheme: str, options: dict[str, object]) -> None:
    ds = numbered()
    shards = partition(ds, scheme, 10, seed=4, **options)  # type: ignore[arg-type]
    owned = np.concatenate([held(s) for s in shards])
    np.testing.assert_array_equal(np.sort(owned), np.arange(len(ds.train_y)))
    for s in shards:
        assert s.index == shards.index(s) and s.partition == scheme and s.seed == 4
        np.testing.assert_array_equal(s.train_y, ds.train_y[held(s)])
        np.testing.assert_array_equal(s.train_x, ds.train_x[held(s)])
        assert len(s.train_y) >= 10


def test_feature_shift_keeps_the_iid_assignment() -> None:
    ds = numbered()
    shifted = partition(ds, "feature-shift", 6, seed=9)
    plain = partition(ds, "iid", 6, seed=9)
    for a, b in zip(shifted, plain, strict=True):
        np.testing.assert_array_equal(a.train_y, b.train_y)
        assert a.train_x.dtype == np.uint8 and a.train_x.shape == b.train_x.shape


@pytest.mark.parametrize(("scheme", "options"), SCHEMES)
def test_same_seed_same_shards_other_seed_other_shards(scheme: str, options: dict[str, object]) -> None:
    ds = numbered(n=1500, n_test=300)
    first, again, other = (partition(ds, scheme, 8, seed=s, **options) for s in (1, 1, 2))  # type: ignore[arg-type]
    for a, b in zip(first, again, strict=True):
        for part in ("train_x", "train_y", "test_x", "test_y"):
            np.testing.assert_array_equal(getattr(a, part), getattr(b, part))
        assert a.meta == b.meta
    assert any(not np.array_equal(a.train_x, b.train_x) for a, b in zip(first, other, strict=True))


@settings(max_examples=30, deadline=None)
@given(
    clients=st.integers(1, 30),
    seed=st.integers(0, 2**32),
    alpha=st.floats(0.05, 100.0),
    scheme=st.sampled_from(["iid", "dirichlet", "dominant"]),
)
def test_assignment_is_a_partition(clients: int, seed: int, alpha: float, scheme: str) -> None:
    labels = np.random.default_rng(seed).integers(0, 10, 1000)
    try:
        parts, metas = split_indices(labels, 10, scheme, clients, np.random.default_rng(seed), alpha=alpha,
                                     classes_per_client=4, dominant_classes=2, classes_layout="random",
                                     min_size=10)
    except DataError as exc:
        assert scheme == "dirichlet" and "attempts" in str(exc)
        return
    assert len(parts) == len(metas) == clients
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
    assert min(len(p) for p in parts) >= 10
    assert all(np.all(np.diff(p) > 0) for p in parts)


def test_too_many_clients_is_refused() -> None:
    with pytest.raises(DataError, match="need 3010 training samples"):
        partition(numbered(), "iid", 301, seed=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scheme": "shards"}, "unknown partition"),
        ({"clients": 0}, "clients must be a positive integer"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"alpha": 0.0}, "alpha must be a positive number"),
        ({"classes_layout": "ring"}, "unknown classes layout"),
        ({"min_size": -3}, "min_size"),
    ],
)
def test_bad_requests_are_refused(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"scheme": "iid", "clients": 4, "seed": 0, **kwargs}
    with pytest.raises(DataError, match=message):
        partition(numbered(n=200, n_test=50), **args)  # type: ignore[arg-type]
