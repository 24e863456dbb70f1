"""A FedAvg delta carrying, beside its dense tensor, an empty sparse section is refused
when it arrives, with a reason naming its device, under a private sum and under multi-krum, first or last in the
round; the round closes on the others, exactly as if that update had never been sent, and only they are committed."""

from __future__ import annotations

import pytest

from tests.refusals import Driven, delta_frame, empty_sparse, honest

CLIENTS = 6


def played(mode: str, bad: int | None, leave_out: int | None = None) -> Driven:
    driven = Driven(CLIENTS, mode=mode)
    driven.open()
    for index in range(CLIENTS):
        if index != leave_out:
            driven.send(index, delta_frame(index, honest(index), empty_sparse() if index == bad else None))
    return driven


@pytest.mark.parametrize("mode", ["private", "multi-krum", "multi-krum held"])
@pytest.mark.parametrize("bad", [0, CLIENTS - 1], ids=["first", "last"])
def test_an_unexpected_sparse_section_is_refused_and_the_round_is_as_without_it(mode: str, bad: int) -> None:
    without = played(mode, None, leave_out=bad)
    expected = without.close()
    driven = played(mode, bad)
    assert driven.protocol.complete(1.0)  # nobody is awaited: the refused device's part ended
    (refusal,) = driven.rejected
    assert refusal.peer == f"c{bad}".encode() and "sparse section" in refusal.reason
    assert driven.close() == expected
    assert sorted(driven.committed) == sorted(without.committed) == [f"c{i}" for i in range(CLIENTS) if i != bad]
