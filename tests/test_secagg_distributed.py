"""Distributed noise's encoding (``secagg.distributed``) and its accounting (``coordinator.skellam``): the rotation
keeps norms and undoes itself, a device's rounded input never exceeds the sensitivity the accountant uses, the noise
has the variance each device is told to add and the sum carries all of it, the scale keeps the sum inside the field
(measured), and the Skellam bound is the paper's formula, converging to dp-accounting's Gaussian as the scale grows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedge.coordinator.skellam import ORDERS, SkellamRound, epsilon_of, skellam_rdp, total_rdp
from fedge.secagg import field
from fedge.secagg.distributed import (
    NoisyGrid,
    hadamard,
    padded_size,
    rounded_l1_bound,
    rounded_l2_bound,
    skellam,
    wrap_scale,
)


def test_the_rotation_keeps_norms_and_undoes_itself() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=256)
    assert np.isclose(np.linalg.norm(hadamard(values)), np.linalg.norm(values))
    assert np.allclose(hadamard(hadamard(values)), values)
    grid = NoisyGrid(16, 200, 1.0, 50.0, 0.0, rotation_seed=7)
    change = rng.normal(size=200)
    assert grid.padded == padded_size(200) == 256 and np.allclose(grid.unrotate(grid.rotate(change)), change)
    spike = np.zeros(200)
    spike[3] = 1.0  # all of its mass on one coordinate: rotated, spread over all of them
    assert np.abs(grid.rotate(spike)).max() == pytest.approx(1 / 16)
    with pytest.raises(ValueError, match="power of two"):
        hadamard(np.ones(3))


def test_a_rounded_input_never_exceeds_the_sensitivity_and_is_unbiased() -> None:
    grid = NoisyGrid(20, 300, 0.5, 8.0, 0.0, rotation_seed=1)
    rng = np.random.default_rng(2)
    change = rng.normal(0, 1, 300)  # norm ~17: clipped to 0.5
    draws = np.stack([grid.integers(change, rng) for _ in range(400)])
    assert (np.linalg.norm(draws.astype(float), axis=1) <= grid.sensitivity()).all()
    expected = grid.rotate(change * (0.5 / np.linalg.norm(change))) * grid.scale
    assert np.abs(draws.mean(axis=0) - expected).max() < 0.15  # rounding is unbiased (400 draws of spread <= 1/2)
    assert grid.sensitivity() == rounded_l2_bound(4.0, 512) < 4.0 + math.sqrt(512)

    class Tight(NoisyGrid):  # a bound half of the plain draws exceed: the rounding must draw again until it holds
        def sensitivity(self) -> float:
            return median

    plain = np.stack([np.floor(expected) + (rng.random(512) < expected - np.floor(expected)) for _ in range(200)])
    median = float(np.median(np.linalg.norm(plain, axis=1)))
    tight = Tight(20, 300, 0.5, 8.0, 0.0, rotation_seed=1)
    assert all(np.linalg.norm(tight.integers(change, rng).astype(float)) <= median for _ in range(100))


def test_the_sum_carries_every_devices_noise_and_decodes_to_the_mean() -> None:
    devices, release = 8, 6
    grid = NoisyGrid(24, 1000, 1.0, 400.0, 0.0, rotation_seed=3)
    noisy = NoisyGrid(24, 1000, 1.0, 400.0, (400.0 * 0.2) ** 2 / release, rotation_seed=3)
    rng, noise_rng = np.random.default_rng(4), np.random.default_rng(5)
    changes = [rng.normal(0, 0.01, 1000) for _ in range(devices)]  # within the clip
    plain = np.zeros(1024, np.uint64)
    summed = np.zeros(1024, np.uint64)
    for change in changes:
        plain = field.add(plain, grid.encode(change, rng), 24)
        summed = field.add(summed, noisy.encode(change, rng, noise_rng), 24)
    mean = np.mean(changes, axis=0)
    assert np.abs(grid.mean(plain, devices) - mean).max() < 3 / 400  # rounding only
    error = noisy.mean(summed, devices) - mean
    expected_std = math.sqrt(devices * noisy.noise) / noisy.scale / devices  # the devices' noise, summed
    assert 0.9 < float(error.std()) / expected_std < 1.1
    draws = skellam(30.0, 200_000, np.random.default_rng(6))
    assert abs(draws.mean()) < 0.05 and 0.97 < draws.var() / 30.0 < 1.03


def test_the_scale_keeps_the_sum_inside_the_field() -> None:
    """Eight devices whose clipped changes all point the same way (the worst case for a wrap), noise as a release of
    six assumes, 12 bits: no coordinate of 200 rounds' sums leaves the field at ``wrap_scale``; at four times it,
    many do (the check can fail)."""
    bits, devices, release, clip, multiplier = 12, 8, 6, 1.0, 1.0
    dimension = 256
    scale = wrap_scale(bits, clip, dimension, devices, multiplier, release)
    rng = np.random.default_rng(7)

    def wraps(at: float) -> int:
        grid = NoisyGrid(bits, dimension, clip, at, (at * multiplier * clip) ** 2 / release, rotation_seed=8)
        change = np.full(dimension, clip / math.sqrt(dimension))
        count = 0
        for _ in range(200):
            true = sum(grid.integers(change, rng) + skellam(grid.noise, dimension, rng) for _ in range(devices))
            count += int((np.abs(true) >= 1 << (bits - 1)).sum())
        return count

    assert wraps(scale) == 0 and wraps(4 * scale) > 100


def test_the_skellam_bound_is_the_papers_formula() -> None:
    assert skellam_rdp(2, 1.0, 1.0, 1.0) == pytest.approx(2 / 2 + min((3 + 6) / 4, 3 / 2))
    assert skellam_rdp(5, 3.0, 2.0, 10.0) == pytest.approx(5 * 9 / 20 + min((9 * 9 + 12) / 400, 6 / 20))
    assert rounded_l1_bound(3.0, 100) == 9.0 and rounded_l1_bound(30.0, 100) == 300.0
    with pytest.raises(ValueError):
        skellam_rdp(1, 1.0, 1.0, 1.0)


# (clip, scale, padded dimension, noise stddev before scaling) -> the rounded L2 and L1 sensitivities and the RDP at
# orders 2, 16 and 128, as the paper's authors' own code computes them: google-research/federated,
# distributed_dp/accounting_utils.py at a5af8c4 (rounded_l2_norm_bound with beta = exp(-1/2),
# rounded_l1_norm_bound, _skellam_rdp), run on these inputs. Their code works in unscaled units; ours in integer
# units (sensitivities times the scale, variance times its square).
AUTHORS_VALUES = [
    (0.03, 1024.0, 1 << 20, 0.02, 513.4495480570608, 263630.43840000004,
     (631.9157177852468, 5042.213293776848, 40324.59390170966)),
    (1.0, 64.0, 1 << 16, 0.5, 143.77760604489143, 20672.0, (20.231857299804688, 161.68235778808594, 1293.286361694336)),
    (0.1, 4096.0, 1 << 18, 0.1, 483.7083418755563, 233973.76000000004,
     (1.3946109880962467, 11.156815171114431, 89.2544486352599)),
]


@pytest.mark.parametrize("clip, scale, dimension, stddev, l2, l1, rdp", AUTHORS_VALUES)
def test_the_skellam_bound_gives_the_authors_values(clip: float, scale: float, dimension: int, stddev: float,
                                                    l2: float, l1: float, rdp: tuple[float, ...]) -> None:
    assert rounded_l2_bound(scale * clip, dimension) == pytest.approx(l2, rel=1e-12)
    assert rounded_l1_bound(l2, dimension) == pytest.approx(l1, rel=1e-12)
    ours = [skellam_rdp(order, l2, l1, (scale * stddev) ** 2) for order in (2, 16, 128)]
    assert ours == pytest.approx(list(rdp), rel=1e-9)


def test_the_skellam_epsilon_tends_to_the_gaussians_as_the_scale_grows() -> None:
    """Against dp-accounting's Gaussian event, composed over 50 rounds at the same noise multiplier: the discrete
    mechanism costs more at a coarse scale (rounding inflates the sensitivity) and converges to it at a fine one."""
    import dp_accounting

    gaussian = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    gaussian.compose(dp_accounting.GaussianDpEvent(1.0), 50)
    reference = gaussian.get_epsilon(1e-5)
    epsilons = []
    for scale in (100.0, 1e4, 1e6):
        l2 = rounded_l2_bound(scale, 1 << 16)
        epsilons.append(epsilon_of(total_rdp([SkellamRound(l2, rounded_l1_bound(l2, 1 << 16), scale ** 2)] * 50),
                                   1e-5))
    assert epsilons[0] > epsilons[1] > epsilons[2] >= reference * 0.999
    assert epsilons[2] == pytest.approx(reference, rel=1e-3)
    assert epsilon_of(total_rdp([]), 1e-5) == 0.0


def test_the_noise_keeps_its_low_bits_at_the_largest_variance_a_grid_takes() -> None:
    """numpy's Poisson draws lose their low bits above 2^53: a grid refuses a variance beyond ``MAX_NOISE``, the
    session's scale never asks for one (however wide the field), and at ``MAX_NOISE`` the draws still take odd
    values (their greatest common divisor is 1)."""
    from fedge.coordinator.distributed import SessionNoise
    from fedge.coordinator.sections import PrivacySection
    from fedge.secagg.distributed import MAX_NOISE

    draws = skellam(MAX_NOISE, 4096, np.random.default_rng(9))
    assert math.gcd(*(int(d) for d in draws)) == 1
    with pytest.raises(ValueError, match="lose their low bits"):
        NoisyGrid(48, 16, 1.0, 1e9, MAX_NOISE * 4, rotation_seed=1)

    class NoLog:
        def read_jsonl(self, name: str) -> list:
            return []

    noise = SessionNoise(PrivacySection(mode="distributed", noise_multiplier=1.0), 10, NoLog())  # type: ignore[arg-type]
    for bits in (16, 32, 48, 62):
        assert noise.grid(bits, 1000, 10, 7).noise <= MAX_NOISE
