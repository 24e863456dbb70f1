"""`partition`: a Dataset cut into seeded client shards, each with its own personal test split.

The training samples are assigned by `fldata.schemes`; feature-shift clients then pass their images
through `fldata.shift`. Each client's test split is drawn from the official test set with the client's
training label proportions: max(MIN_TEST_SIZE, round(len(test) * n_i / n)) samples, the per-class counts
apportioned by largest remainder, drawn without replacement while the class has enough test images and
topped up with replacement only beyond that. Feature-shift clients get their transform on the test split
too. The global test set stays the official one (`Dataset.test_x`). This module must not know about files,
the CLI or any other Fedge package.

Float targets (regression, multi-label): ``iid`` splits them as any data; the label-based schemes (``dirichlet``,
``classes``, ``dominant``) use as a sample's class the decile of its first target value (`target_strata`: at most
TARGET_STRATA bins of equal count over the training set, fewer where values repeat), and the personal test splits
follow the same strata. ``feature-shift`` needs uint8 images.

Random streams: one seed feeds independent numpy streams keyed (seed, STREAM_*, ...), so the assignment,
the test splits and the transforms never disturb each other.
"""

from __future__ import annotations

import math

import numpy as np

from fedge.fldata.dataset import DataError, Dataset
from fedge.fldata.schemes import LAYOUTS, split_indices
from fedge.fldata.shard import ClientShard
from fedge.fldata.shift import apply_shift, draw_shift

PARTITIONERS = ("iid", "dirichlet", "classes", "dominant", "feature-shift")
MIN_TEST_SIZE = 20
TARGET_STRATA = 10
STREAM_ASSIGN, STREAM_TEST, STREAM_SHIFT, STREAM_NOISE = 0, 1, 2, 3


def partition(
    dataset: Dataset,
    scheme: str,
    clients: int,
    *,
    seed: int,
    alpha: float = 0.3,
    classes_per_client: int = 4,
    dominant_classes: int = 2,
    classes_layout: str = "random",
    min_size: int = 10,
) -> list[ClientShard]:
    """dataset split among clients by scheme (one of PARTITIONERS); the same seed gives the same shards."""
    _check_request(scheme, clients, seed, alpha, classes_layout, min_size)
    clients, seed, min_size = int(clients), int(seed), int(min_size)
    if len(dataset.train_y) == 0:
        raise DataError(f"{dataset.name}: no training samples to partition")
    if scheme == "feature-shift" and (dataset.train_x.dtype != np.uint8 or len(dataset.input_shape) != 3):
        raise DataError(f"feature-shift transforms uint8 images (C, H, W); {dataset.name} has "
                        f"{dataset.train_x.dtype} samples shaped {dataset.input_shape}")
    train_classes, test_classes, strata = _classes_of(dataset)
    indices, metas = split_indices(
        train_classes, strata, scheme, clients, np.random.default_rng([seed, STREAM_ASSIGN]),
        alpha=alpha, classes_per_client=classes_per_client, dominant_classes=dominant_classes,
        classes_layout=classes_layout, min_size=min_size,
    )
    test_rng = np.random.default_rng([seed, STREAM_TEST])
    test_by_class = [np.flatnonzero(test_classes == c) for c in range(strata)]
    total = len(dataset.train_y)
    shards = []
    for i, (idx, meta) in enumerate(zip(indices, metas, strict=True)):
        train_x, train_y = dataset.train_x[idx], dataset.train_y[idx]
        test_idx = personal_test_indices(
            np.bincount(train_classes[idx], minlength=strata), total, len(dataset.test_y), test_by_class, test_rng,
        )
        test_x, test_y = dataset.test_x[test_idx], dataset.test_y[test_idx]
        if scheme == "feature-shift":
            shift = draw_shift(np.random.default_rng([seed, STREAM_SHIFT, i]))
            noise = np.random.default_rng([seed, STREAM_NOISE, i])
            train_x = apply_shift(train_x, shift, noise)
            test_x = apply_shift(test_x, shift, noise)
            meta = {**meta, "transform": shift.as_dict()}
        shards.append(ClientShard(
            index=i, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
            num_classes=dataset.num_classes, mean=dataset.mean, std=dataset.std, dataset=dataset.name,
            partition=scheme, seed=seed, meta={**meta, "min_size": min_size},
        ))
    return shards


def _classes_of(dataset: Dataset) -> tuple[np.ndarray, np.ndarray, int]:
    """(train classes, test classes, count): the labels themselves, or the strata of float targets."""
    if not dataset.has_targets:
        return dataset.train_y, dataset.test_y, dataset.num_classes
    edges = target_strata(dataset.train_y[:, 0])
    train = np.searchsorted(edges, dataset.train_y[:, 0], side="right").astype(np.int64)
    test = np.searchsorted(edges, dataset.test_y[:, 0], side="right").astype(np.int64)
    return train, test, len(edges) + 1


def target_strata(values: np.ndarray) -> np.ndarray:
    """The inner edges of at most TARGET_STRATA equal-count bins of values (duplicates merged)."""
    quantiles = np.quantile(values.astype(np.float64), np.linspace(0, 1, TARGET_STRATA + 1)[1:-1])
    return np.unique(quantiles)


def personal_test_indices(
    train_counts: np.ndarray,
    train_total: int,
    test_total: int,
    test_by_class: list[np.ndarray],
    rng: np.random.Generator,
) -> np.ndarray:
    """Sorted test-set indices for one client whose training labels are counted in train_counts."""
    available = np.array([len(t) for t in test_by_class])
    weights = np.where(available > 0, train_counts, 0).astype(np.float64)
    if test_total == 0 or weights.sum() == 0:
        return np.zeros(0, dtype=np.int64)
    size = max(MIN_TEST_SIZE, round(test_total * int(train_counts.sum()) / train_total))
    targets = apportion(size, weights)
    picks = []
    for c, want in enumerate(targets):
        pool = test_by_class[c]
        if want == 0:
            continue
        if want <= len(pool):
            picks.append(rng.choice(pool, size=want, replace=False))
        else:
            picks.append(pool)
            picks.append(rng.choice(pool, size=want - len(pool), replace=True))
    return np.sort(np.concatenate(picks))


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """total split into integers proportional to weights (largest remainder; ties to the lower index)."""
    exact = total * weights / weights.sum()
    counts: np.ndarray = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:short]] += 1
    return counts


def _check_request(scheme: str, clients: int, seed: int, alpha: float, layout: str, min_size: int) -> None:
    if scheme not in PARTITIONERS:
        raise DataError(f"unknown partition {scheme!r}; choose one of {', '.join(PARTITIONERS)}")
    if not _is_int(clients) or clients < 1:
        raise DataError(f"clients must be a positive integer, got {clients!r}")
    if not _is_int(seed) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise DataError(f"alpha must be a positive number, got {alpha!r}")
    if layout not in LAYOUTS:
        raise DataError(f"unknown classes layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if not _is_int(min_size) or min_size < 0:
        raise DataError(f"min_size must be a non-negative integer, got {min_size!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
