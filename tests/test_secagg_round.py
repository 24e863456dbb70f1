"""One secure-aggregation round, both sides' state machines (``secagg.device``, ``secagg.aggregator``) played in
memory: the unmasked sum is the survivors' field words bit for bit, whoever drops at whichever stage; the rules
that keep it sound refuse what would reveal one device's input."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from fedge.secagg import field, shamir
from fedge.secagg.aggregator import RoundFailed, RoundStage, SecAggRound
from fedge.secagg.device import Refused, SecAggDevice
from fedge.secagg.graph import threshold_of
from fedge.secagg.keys import round_context, support_digest
from fedge.secagg.messages import Delivery, Keys, MaskedInput, Setup, UnmaskRequest

BITS = 20


def setup(size: int = 64, threshold: float = 0.6, complete_up_to: int = 50, bits: int = BITS) -> Setup:
    return Setup(round_context("run-1", 3, 0, support_digest(None, size)), bits, size, threshold, complete_up_to,
                 graph_seed=11)


def inputs(names: Sequence[str], size: int, bits: int = BITS, seed: int = 0) -> dict[str, field.U64]:
    rng = np.random.default_rng(seed)
    levels = field.levels_for(bits, len(names))
    return {name: field.lift(rng.integers(-levels, levels + 1, size), bits) for name in names}


def play(n: int, drop_keys: Sequence[int] = (), drop_shares: Sequence[int] = (), drop_masked: Sequence[int] = (),
         silent: Sequence[int] = (), the_setup: Setup | None = None) -> tuple[field.U64, field.U64, tuple[str, ...]]:
    """A round of ``n`` devices, some dropping before their keys, their shares or their masked input, some not
    answering the unmask request; returns the unmasked sum, the expected sum of the survivors' words (a hook
    recorded before masking) and the survivors."""
    the_setup = the_setup or setup()
    names = [f"dev-{i:03d}" for i in range(n)]
    words = inputs(names, the_setup.size, the_setup.bits)
    devices = {name: SecAggDevice(name, the_setup) for name in names}
    coordinator = SecAggRound(the_setup, names)
    for i, name in enumerate(names):
        if i not in drop_keys:
            assert coordinator.add_keys(devices[name].keys()) == ""
    roster = coordinator.close_keys()
    for i, name in enumerate(names):
        if i not in drop_keys and i not in drop_shares:
            assert coordinator.add_shares(devices[name].share(roster)) == ""
    deliveries = coordinator.close_shares()
    recorded = {}
    for i, name in enumerate(names):
        if name in deliveries and i not in drop_masked:
            recorded[name] = words[name]
            assert coordinator.add_masked(devices[name].mask(deliveries[name], words[name])) == ""
    request = coordinator.close_inputs()
    for i, name in enumerate(names):
        if name in request.survivors and i not in silent:
            assert coordinator.add_unmask(devices[name].unmask(request)) == ""
    result = coordinator.finish()
    expected = np.zeros(the_setup.size, np.uint64)
    for name in result.contributors:
        expected = field.add(expected, recorded[name], the_setup.bits)
    return result.words, expected, result.contributors


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.3])
def test_the_sum_is_the_survivors_words_bit_for_bit_with_dropouts_after_masking(fraction: float) -> None:
    n = 10
    dropped = list(range(0, int(fraction * n)))
    total, expected, survivors = play(n, silent=dropped)  # silent: masked, then gone before unmasking
    assert np.array_equal(total, expected) and len(survivors) == n


@pytest.mark.parametrize("fraction", [0.1, 0.3])
def test_devices_lost_before_their_masked_input_leave_no_mask_behind(fraction: float) -> None:
    n = 10
    total, expected, survivors = play(n, drop_masked=list(range(int(fraction * n))))
    assert np.array_equal(total, expected) and len(survivors) == n - int(fraction * n)


def test_devices_lost_during_key_sharing_are_left_out_and_the_rest_sum_exactly() -> None:
    total, expected, survivors = play(12, drop_keys=[0], drop_shares=[5, 7], drop_masked=[3], silent=[9])
    assert np.array_equal(total, expected)
    assert set(survivors) == {f"dev-{i:03d}" for i in range(12)} - {"dev-000", "dev-005", "dev-007", "dev-003"}


def test_a_sparse_graph_sums_exactly_with_dropouts() -> None:
    the_setup = setup(size=32, complete_up_to=10)  # 40 devices: a Harary graph of degree 2 ceil(log2 40) + 2
    total, expected, _ = play(40, drop_shares=[1], drop_masked=[2, 30], silent=[4, 17], the_setup=the_setup)
    assert np.array_equal(total, expected)


def test_a_field_of_62_bits_and_one_of_8_sum_exactly() -> None:
    for bits in (8, 62):
        total, expected, _ = play(5, drop_masked=[1], the_setup=setup(size=40, bits=bits))
        assert np.array_equal(total, expected)


def test_too_few_survivors_fail_the_round_with_its_reason() -> None:
    with pytest.raises(RoundFailed, match="fewer than its threshold"):
        play(10, drop_masked=[0, 1, 2, 3, 4])  # 5 of 10 left: each has 4 live neighbours, t = ceil(0.6 * 9) = 6
    with pytest.raises(RoundFailed, match="too few unmask shares"):
        play(10, silent=[0, 1, 2, 3])  # 6 answer: each survivor's seed has at most 5 shares from its neighbours


def shared(names: Sequence[str], the_setup: Setup) -> tuple[SecAggRound, dict[str, SecAggDevice],
                                                               dict[str, Delivery]]:
    """A round whose devices have all advertised their keys and shared: the coordinator, the devices and each
    device's delivery."""
    devices = {name: SecAggDevice(name, the_setup) for name in names}
    coordinator = SecAggRound(the_setup, list(names))
    for name in names:
        coordinator.add_keys(devices[name].keys())
    roster = coordinator.close_keys()
    for name in names:
        coordinator.add_shares(devices[name].share(roster))
    return coordinator, devices, coordinator.close_shares()


def masked_round(n: int = 6) -> tuple[SecAggRound, dict[str, SecAggDevice], dict[str, field.U64]]:
    """A round at its unmask stage: every device has masked, none answered yet."""
    the_setup = setup(size=256)
    names = [f"dev-{i}" for i in range(n)]
    words = inputs(names, the_setup.size)
    coordinator, devices, deliveries = shared(names, the_setup)
    return coordinator, devices, {name: devices[name].mask(deliveries[name], words[name]).words for name in names}


def test_a_device_refuses_to_give_both_shares_of_one_device() -> None:
    _, devices, _ = masked_round()
    names = sorted(devices)
    greedy = UnmaskRequest(survivors=tuple(names), dropped=(names[1],))  # dev-1 listed as both
    with pytest.raises(Refused, match="both survivor and dropped"):
        devices[names[0]].unmask(greedy)


def test_a_device_answers_one_unmask_request_only() -> None:
    coordinator, devices, masked = masked_round()
    names = sorted(devices)
    for name in names:
        coordinator.add_masked(MaskedInput(name, masked[name]))
    request = coordinator.close_inputs()
    devices[names[0]].unmask(request)
    later = UnmaskRequest(survivors=tuple(names[1:]), dropped=(names[0],))  # now asking for the other kind
    with pytest.raises(Refused, match="stage done"):
        devices[names[1]].unmask(request)  # fine once
        devices[names[1]].unmask(later)


def test_a_masked_input_after_its_stage_closed_is_refused() -> None:
    coordinator, devices, masked = masked_round()
    names = sorted(devices)
    for name in names[1:]:
        assert coordinator.add_masked(MaskedInput(name, masked[name])) == ""
    request = coordinator.close_inputs()
    assert request.dropped == (names[0],)
    reason = coordinator.add_masked(MaskedInput(names[0], masked[names[0]]))  # too late: it is counted as dropped
    assert "counted as dropped" in reason
    for name in names[1:]:
        coordinator.add_unmask(devices[name].unmask(request))
    coordinator.finish()
    assert coordinator.stage is RoundStage.SUMMED


def test_masked_words_look_uniform() -> None:
    """A device's masked words, its input all zeros, spread evenly over the field (chi-square over 32 bins)."""
    the_setup = setup(size=32768)
    _, devices, deliveries = shared(["a", "b", "c"], the_setup)
    words = devices["a"].mask(deliveries["a"], np.zeros(the_setup.size, np.uint64)).words
    counts = np.bincount((words >> np.uint64(BITS - 5)).astype(np.int64), minlength=32)
    expected = the_setup.size / 32
    assert float(np.sum((counts - expected) ** 2 / expected)) < 61.1  # p = 0.001, 31 degrees of freedom


def test_a_forged_or_misaddressed_share_is_refused() -> None:
    the_setup = setup()
    _, devices, deliveries = shared(["a", "b", "c", "d"], the_setup)
    forged = dataclasses.replace(deliveries["a"].shares[0],
                                 sealed=deliveries["a"].shares[0].sealed[:-1] + bytes([deliveries["a"].shares[0].sealed[-1] ^ 1]))
    with pytest.raises(Refused, match="does not open"):
        devices["a"].mask(dataclasses.replace(deliveries["a"], shares=(forged, *deliveries["a"].shares[1:])),
                          np.zeros(the_setup.size, np.uint64))
    with pytest.raises(Refused, match="not one this device awaits"):
        devices["b"].mask(deliveries["a"], np.zeros(the_setup.size, np.uint64))


def test_a_roster_that_repeats_a_key_is_refused() -> None:
    the_setup = setup()
    devices = {name: SecAggDevice(name, the_setup) for name in ("a", "b", "c")}
    coordinator = SecAggRound(the_setup, list(devices))
    for device in devices.values():
        coordinator.add_keys(device.keys())
    roster = coordinator.close_keys()
    copied = dataclasses.replace(roster, keys=(roster.keys[0], roster.keys[1],
                                               dataclasses.replace(roster.keys[2], masking=roster.keys[0].masking)))
    with pytest.raises(Refused, match="repeats"):
        devices["c"].share(copied)


def test_a_low_order_public_key_is_refused_by_the_coordinator_and_by_every_device() -> None:
    """An all-zero key agrees a zero secret with anyone: accepted, it made every honest device raise (review)."""
    the_setup = setup()
    coordinator = SecAggRound(the_setup, ["a", "b", "c", "evil"])
    devices = {name: SecAggDevice(name, the_setup) for name in ("a", "b", "c")}
    for device in devices.values():
        assert coordinator.add_keys(device.keys()) == ""
    assert "low order" in coordinator.add_keys(Keys("evil", bytes(32), b"\x01" + bytes(31), bytes(32)))
    roster = coordinator.close_keys()
    bad = dataclasses.replace(roster, keys=(*roster.keys, Keys("evil", bytes(32), b"\x01" + bytes(31))))
    with pytest.raises(Refused, match="low order"):
        devices["a"].share(bad)


def answered_round() -> tuple[SecAggRound, dict[str, SecAggDevice]]:
    """A round whose every device has masked and answered the unmask request: ready to ``finish``."""
    coordinator, devices, masked = masked_round()
    for name, words in masked.items():
        coordinator.add_masked(MaskedInput(name, words))
    request = coordinator.close_inputs()
    for name in request.survivors:
        coordinator.add_unmask(devices[name].unmask(request))
    return coordinator, devices


def test_shares_that_rebuild_no_secret_fail_the_round_with_its_reason() -> None:
    coordinator, devices = answered_round()
    victim = sorted(coordinator.masked)[0]  # the first survivor
    point = next(iter(coordinator.seed_shares[victim]))
    coordinator.seed_shares[victim][point] = (1, 2, 3)  # a survivor lying about its share
    with pytest.raises(RoundFailed, match="cannot be unmasked"):
        coordinator.finish()
    assert coordinator.stage is RoundStage.FAILED


def test_three_devices_whose_ring_would_join_them_all_share_as_a_complete_graph() -> None:
    total, expected, _ = play(3, the_setup=setup(complete_up_to=2))  # a ring of half 3 over 3 devices
    assert np.array_equal(total, expected)


def test_every_threshold_is_above_half_of_its_neighbourhood() -> None:
    assert all(2 * threshold_of(k, 0.5 + 1e-14) > k for k in range(1, 200))


def test_a_seed_share_shifted_to_rebuild_another_seed_is_caught_by_the_commitment() -> None:
    """A survivor that knows the Lagrange weights can shift its share so that the seed rebuilt is off by exactly one
    (still 32 bytes): without the commitment the sum came out wrong, unnoticed (review)."""
    coordinator, devices = answered_round()
    victim = sorted(coordinator.masked)[0]  # the first survivor
    shares = coordinator.seed_shares[victim]
    used = sorted(shares)[:coordinator.thresholds[victim]]
    liar = used[0]
    weight = 1
    for x in used[1:]:
        weight = weight * x * pow(x - liar, -1, shamir.PRIME) % shamir.PRIME
    first, *rest = shares[liar]
    shares[liar] = ((first + pow(weight, -1, shamir.PRIME)) % shamir.PRIME, *rest)  # the seed's first chunk + 1
    rebuilt = shamir.reconstruct_bytes(shares, coordinator.thresholds[victim], 32)
    assert rebuilt != devices[victim].seed and len(rebuilt) == 32  # a valid seed, but another one
    with pytest.raises(RoundFailed, match="does not match its commitment"):
        coordinator.finish()
