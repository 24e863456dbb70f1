"""A device whose update is refused (here at decoding: one NaN) has its part in the round ended at once: the round
closes as soon as the others have reported, long before its deadline, and the device gets no Commit; in an
asynchronous session its task is ended."""

from __future__ import annotations

from fedge.protocol.round import ClientOutcome
from tests.refusals import Driven, delta_frame, honest, nan_frame


def test_a_nan_update_ends_its_devices_part_and_the_round_closes_without_waiting() -> None:
    driven = Driven(3, deadline_s=300.0)
    driven.open()
    driven.send(0, delta_frame(0, honest(0)), now=1.0)
    driven.send(1, nan_frame(1), now=2.0)
    (refusal,) = driven.rejected
    assert refusal.peer == b"c1" and refusal.code == "malformed" and "NaN" in refusal.reason
    assert not driven.protocol.complete(3.0)  # c2 is still awaited
    driven.send(2, delta_frame(2, honest(2)), now=4.0)
    assert driven.protocol.complete(4.0)  # at 4 s of its 300: c1 is not waited for
    current = driven.protocol.current
    assert current is not None and current.outcomes[1] is ClientOutcome.REFUSED and "NaN" in current.refused[1]
    driven.close(now=4.0)
    assert driven.committed == ["c0", "c2"]
