"""Both sides of a securely aggregated round as the protocol plays them (``protocol.secure_device`` on each device,
``protocol.secure_round`` on the coordinator), every message a real packet and each masked input in a real Update:
the coordinator's mean is exactly the mean of the survivors' quantised changes; nonsense settings, a stage message
of another attempt and a second delivery are refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedge import codec
from fedge.protocol.events import Send
from fedge.protocol.secure_device import SecureDevice, SecureLayout, masked_words
from fedge.protocol.secure_round import SecureRound, peers_by_id
from fedge.secagg import field
from fedge.secagg.device import Refused
from fedge.secagg.encoding import grid_for, rounding_rng, setup_of, task_settings

SIZES = [12, 4]
LAYOUT = SecureLayout((("w", (3, 4)), ("b", (4,))))
SEED = 7


def wire(message: codec.Message) -> codec.Message:
    return codec.decode(codec.encode(message))


def task(attempt: int = 0, devices: int = 6) -> codec.Task:
    settings = task_settings(grid_for(16, 0.5, SIZES, devices), 0.6, 50, 3, attempt)
    return codec.Task("r1", 5, "coordinator", secagg=settings)


def test_the_coordinators_mean_is_the_survivors_quantised_mean() -> None:
    names = [f"a{i}" for i in range(6)]
    the_task = wire(task())
    assert isinstance(the_task, codec.Task) and the_task.secagg is not None
    devices = {name: SecureDevice("r1", name, i, SEED, the_task, LAYOUT) for i, name in enumerate(names)}
    secure = SecureRound("r1", 5, 0, setup_of("r1", 5, the_task.secagg, sum(SIZES)), names,
                         peers_by_id({n: n.encode() for n in names}), 10.0, now=0.0)
    outbox = [e for name in names for e in secure.receive(name, wire(devices[name].keys()), 0.0)]
    while outbox:  # the roster, then the deliveries
        send = outbox.pop(0)
        assert isinstance(send, Send)
        name = send.peer.decode()
        for reply in devices[name].receive(wire(send.message)):
            outbox += [e for e in secure.receive(name, wire(reply), 0.0) if isinstance(e, Send)]
    rng = np.random.default_rng(1)
    changes = {name: rng.normal(0, 0.05, sum(SIZES)) for name in names}
    for name in names[1:]:  # a0 trains but never sends its masked input
        update = wire(codec.Update("r1", 5, name, groups={"secagg": devices[name].masked_group(changes[name])}))
        assert isinstance(update, codec.Update)
        words, why = masked_words(update.groups, sum(SIZES), 16)
        assert words is not None and why == "" and secure.masked(name, words) == ""
    for send in secure.close_inputs(0.1):
        assert isinstance(send, Send)
        name = send.peer.decode()
        for reply in devices[name].receive(wire(send.message)):
            secure.receive(name, wire(reply), 0.1)
    total = secure.total()
    assert total is not None and secure.contributors == tuple(names[1:])
    grid = devices["a1"].grid
    quantised = [field.signed(grid.encode(changes[name], rounding_rng(SEED, 5, i, 0)), 16)
                 for i, name in enumerate(names) if name != "a0"]
    step = grid.clip_per_coordinate() / grid.levels
    assert np.array_equal(np.round(grid.mean(total, 5) * 5 / step).astype(np.int64), np.sum(quantised, axis=0))
    assert np.max(np.abs(grid.mean(total, 5) - np.mean([changes[n] for n in names[1:]], axis=0))) <= step.max()


def test_a_device_refuses_nonsense_settings_another_attempts_message_and_a_second_delivery() -> None:
    bad = codec.Task("r1", 5, "coordinator", secagg={**task().secagg, "clip": [0.5]})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="2 float tensors"):
        SecureDevice("r1", "a0", 0, SEED, bad, LAYOUT)
    device = SecureDevice("r1", "a0", 0, SEED, task(), LAYOUT)
    with pytest.raises(Refused, match="another round or attempt"):
        device.receive(codec.SecAggDelivery("r1", 5, "coordinator", attempt=1))
    device.receive(codec.SecAggDelivery("r1", 5, "coordinator", attempt=0))
    with pytest.raises(Refused, match="second delivery"):
        device.receive(codec.SecAggDelivery("r1", 5, "coordinator", attempt=0))
    with pytest.raises(Refused, match="no delivery"):
        SecureDevice("r1", "a1", 1, SEED, task(), LAYOUT).masked_group(np.zeros(sum(SIZES)))


def test_an_update_that_is_not_one_masked_tensor_of_the_rounds_width_is_refused() -> None:
    good = codec.TensorGroup(dense={"words": np.zeros(16, np.uint16)})
    assert masked_words({"secagg": good}, 16, 16)[1] == ""
    assert "exactly the group" in masked_words({"model": good}, 16, 16)[1]
    assert "dtype uint32" in masked_words({"secagg": codec.TensorGroup(dense={"words": np.zeros(16, np.uint32)})},
                                          16, 16)[1]
    assert "shape (16,)" in masked_words({"secagg": good}, 17, 16)[1]


def test_a_sparse_rounds_layout_masks_the_dense_tensors_and_the_complement_and_refuses_another_support() -> None:
    """A DSSA round's model group: a dense tensor and a sparse section of retained values on a mask. The layout
    masks the dense tensor, then the complement of the mask; a delta group on that complement reads back as the
    same vector (``groups`` then ``change``); values bound to another mask, indexed values, or a missing tensor are
    refused; and the support bound into every key is the complement's positions."""
    mask = np.array([True, False, False, True, False, True, False, False])
    model = codec.TensorGroup(dense={"b": np.zeros(2, np.float32)}, sparse=codec.SparseSection.with_mask(
        ("w",), ((2, 4),), mask, np.ones(3, np.float32)))
    layout = SecureLayout.of(model)
    assert layout.sizes == [2, 5]
    assert layout.support is not None and list(layout.support) == [0, 1, 3, 4, 6, 8, 9]
    flat = np.arange(7, dtype=np.float64) / 10
    (group,) = layout.groups(flat).values()
    assert np.array_equal(layout.change(group, None), flat.astype(np.float32).astype(np.float64))
    other = codec.TensorGroup(dense=group.dense, sparse=codec.SparseSection.masked_values(
        ("w",), ((2, 4),), ~mask, np.zeros(3, np.float32)))
    indexed = codec.TensorGroup(dense=group.dense, sparse=codec.SparseSection.with_indices(
        ("w",), ((2, 4),), np.flatnonzero(~mask), np.zeros(5, np.float32)))
    lacking = codec.TensorGroup(dense={}, sparse=group.sparse)
    for wrong in (other, indexed, lacking):
        with pytest.raises(Refused):
            layout.change(wrong, None)
