"""A fold that refuses one device's update (``Unfoldable``, as it arrives or when a held round closes) keeps
nothing of it: the closed round's server state is, byte for byte, that of the same round without the update; the
device is named in a refusal, moved to ``ClientOutcome.REFUSED`` and given no Commit; the close does not raise."""

from __future__ import annotations

from typing import Any

import pytest

from fedge.protocol.payload import ClientUpdate
from fedge.protocol.round import ClientOutcome
from fedge.protocol.validation import Unfoldable
from tests.refusals import Driven, delta_frame, flat_server, honest


class Picky:
    """FedAvg's server half, whose fold refuses client 1's update (a check its ``check_update`` does not make)."""

    def __init__(self) -> None:
        self.base = flat_server()

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        if update.index == 1:
            raise Unfoldable("client 1's update is not foldable")
        self.base.fold(round_number, update)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


@pytest.mark.parametrize("mode", ["", "held"], ids=["streaming", "held-bounds"])
def test_a_refused_fold_leaves_the_aggregate_as_without_the_update_and_gives_no_commit(mode: str) -> None:
    without = Driven(6, server=flat_server(), mode=mode)
    without.open()
    for index in (0, 2, 3, 4, 5):
        without.send(index, delta_frame(index, honest(index)))
    expected = without.close()
    driven = Driven(6, server=Picky(), mode=mode)  # type: ignore[arg-type]
    driven.open()
    for index in range(6):
        driven.send(index, delta_frame(index, honest(index)))
    state = driven.protocol.current or driven.protocol.closed
    assert driven.close() == expected
    assert state is not None and state.outcomes[1] is ClientOutcome.REFUSED
    assert [(r.peer, r.code) for r in driven.rejected] == [(b"c1", "invalid-update")]
    assert "not foldable" in driven.rejected[0].reason
    assert driven.committed == ["c0", "c2", "c3", "c4", "c5"]
