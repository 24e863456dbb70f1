"""Feature-shift clients each see their own fixed input transform, determined by the seed and their index."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.fldata import Dataset, load_dataset, partition
from fedge.fldata.shift import Shift, apply_shift


@pytest.fixture(scope="module")
def demo() -> Dataset:
    return load_dataset("fmnist-demo")


def test_transforms_differ_per_client_and_repeat_per_seed(demo: Dataset) -> None:
    a = partition(demo, "feature-shift", 6, seed=11)
    b = partition(demo, "feature-shift", 6, seed=11)
    c = partition(demo, "feature-shift", 6, seed=12)
    transforms = [s.meta["transform"] for s in a]
    assert len({tuple(t.values()) for t in transforms}) == 6
    assert transforms == [s.meta["transform"] for s in b]
    assert transforms != [s.meta["transform"] for s in c]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.train_x, y.train_x)
        np.testing.assert_array_equal(x.test_x, y.test_x)
    # The same images under two clients' transforms: mean brightness and spread differ.
    plain = partition(demo, "iid", 6, seed=11)
    for shifted, raw in zip(a, plain, strict=True):
        assert shifted.train_x.dtype == np.uint8
        assert not np.array_equal(shifted.train_x, raw.train_x)
    means = [float(s.train_x.mean()) for s in a]
    assert len({round(m, 3) for m in means}) == 6


def test_test_split_is_transformed_too(demo: Dataset) -> None:
    raw_test = {img.tobytes() for img in demo.test_x}
    for s in partition(demo, "feature-shift", 4, seed=3):
        unchanged = sum(img.tobytes() in raw_test for img in s.test_x)
        assert unchanged == 0 and len(s.test_x) == 500


def test_identity_transform_is_exact(demo: Dataset) -> None:
    x = demo.train_x[:50]
    out = apply_shift(x, Shift(contrast=1.0, brightness=0.0, noise_std=0.0, rotation_deg=0.0),
                      np.random.default_rng(0))
    np.testing.assert_array_equal(out, x)


def test_transform_is_deterministic_given_its_noise_stream(demo: Dataset) -> None:
    x = demo.train_x[:3000]
    shift = Shift(contrast=1.3, brightness=0.1, noise_std=0.05, rotation_deg=17.0)
    a = apply_shift(x, shift, np.random.default_rng(5))
    b = apply_shift(x, shift, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    assert a.shape == x.shape and a.dtype == np.uint8
    assert not np.array_equal(a, x)
