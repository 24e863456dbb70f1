"""normalize maps uint8 pixels to (x / 255 - mean) / std per channel; summary has the documented shape."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.fldata import ClientShard, DataError, normalize, summary


def test_per_channel_values() -> None:
    x = np.array([[[[0, 255]], [[51, 102]]]], dtype=np.uint8)  # 1 x 2 x 1 x 2
    out = normalize(x, (0.5, 0.2), (0.5, 0.1))
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_allclose(out[0, 0, 0], [-1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(out[0, 1, 0], [0.0, 2.0], atol=1e-5)
    # float32 features are standardised as stored: the same values given in [0, 1] units give the same result
    np.testing.assert_allclose(normalize(x.astype(np.float32) / 255, (0.5, 0.2), (0.5, 0.1)), out, atol=1e-6)


@pytest.mark.parametrize(
    ("x", "mean", "std", "message"),
    [
        (np.zeros((2, 1, 3, 3), np.int16), (0.5,), (0.5,), "uint8 or float32"),
        (np.zeros((3,), np.uint8), (0.5,), (0.5,), "channels in axis 1"),
        (np.zeros((2, 3, 3, 3), np.uint8), (0.5,), (0.5,), "channels"),
        (np.zeros((2, 1, 3, 3), np.uint8), (0.5,), (0.0,), "std > 0"),
    ],
)
def test_bad_input_is_refused(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...], message: str) -> None:
    with pytest.raises(DataError, match=message):
        normalize(x, mean, std)


def test_summary_shape() -> None:
    shard = ClientShard(index=7, train_x=np.zeros((3, 1, 2, 2), np.uint8), train_y=np.array([0, 2, 2]),
                        test_x=np.zeros((1, 1, 2, 2), np.uint8), test_y=np.array([2]), num_classes=4,
                        mean=(0.5,), std=(0.2,), dataset="d", partition="iid", seed=1, meta={})
    assert summary("d", "iid", 1, [shard]) == {
        "dataset": "d", "partition": "iid", "seed": 1,
        "clients": [{"id": 7, "train_size": 3, "test_size": 1, "label_counts": [1, 0, 2, 0]}],
    }
