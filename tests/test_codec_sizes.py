"""Packet sizes are deterministic: the index field stays near log2 C(N, k), and the index-free uplink carries no index."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedge.codec import SparseSection, Task, TensorGroup, Update, encode
from fedge.codec.sparsewire import encode_section

SHAPES = [(64, 3, 3, 3), (256, 1024), (10, 256)]
NAMES = ["conv", "fc1", "fc2"]


def log2_binomial(n: int, k: int) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def index_bytes(section: SparseSection) -> int:
    return sum(len(seg[2]) + len(seg[3]) for seg in encode_section(section, "f32")["ix"])


@pytest.mark.parametrize(("density", "bound"), [(0.01, 1.08), (0.1, 1.05), (0.3, 1.03), (0.5, 1.02), (0.8, 1.03)])
def test_index_field_of_a_uniform_random_mask_is_near_the_floor(density: float, bound: float) -> None:
    rng = np.random.default_rng(11)
    n = sum(math.prod(s) for s in SHAPES)
    mask = np.zeros(n, dtype=bool)
    k = int(density * n)
    mask[rng.choice(n, k, replace=False)] = True
    section = SparseSection.with_mask(NAMES, SHAPES, mask, np.ones(k, np.float32))
    assert index_bytes(section) <= bound * log2_binomial(n, k) / 8


def test_index_free_uplink_costs_only_its_values() -> None:
    rng = np.random.default_rng(5)
    weights = [(rng.standard_normal(s) * 0.05).astype(np.float32) for s in SHAPES]
    n = sum(w.size for w in weights)
    mask = np.abs(np.concatenate([w.reshape(-1) for w in weights])) > 0.06
    up = SparseSection.masked_from_dense(NAMES, weights, mask, select=False)
    assert encode_section(up, "f32")["ix"] == []
    packet = encode(Update("r", 1, "a", {"model": TensorGroup({}, up)}))
    assert len(packet) <= 0.86 * 4 * (n - int(mask.sum())) + 64
    down = encode(Task("r", 1, "c", {"model": TensorGroup({}, SparseSection.from_dense(NAMES, weights, mask))}))
    k = int(mask.sum())
    assert len(down) <= 0.85 * (log2_binomial(n, k) / 8 + 4 * k)
