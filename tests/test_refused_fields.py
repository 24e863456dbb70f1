"""What every mode refuses of an update's runtime fields and tensor kinds, before it is accepted: an integer tensor
where the model's is float (held rounds took the first update's layout as the round's, so one such update, first
in, had every honest update after it refused), a sample count below one, and a meta key only the coordinator sets
(``secure_contributors``, which names the devices a fold counts as having contributed). The round closes to the
state of the same round without that update."""

from __future__ import annotations

import numpy as np
import pytest

from fedge import codec
from tests.refusals import RUN, SIZE, Driven, delta_frame, honest


def frame(index: int, values: np.ndarray, num_samples: int = 10, meta: dict[str, object] | None = None) -> bytes:
    group = codec.TensorGroup(dense={"w": values})
    return codec.encode(codec.Update(run_id=RUN, round=1, sender=f"c{index}", groups={"delta": group},
                                     num_samples=num_samples, meta=meta or {}))


HOSTILE = {
    "integer tensor": (lambda: frame(0, np.arange(SIZE, dtype=np.int32)), "the model's tensor is float"),
    "zero samples": (lambda: frame(0, honest(0), num_samples=0), "at least one sample"),
    "coordinator's meta key": (lambda: frame(0, honest(0), meta={"secure_contributors": [1, 2, 3]}),
                               "only the coordinator sets"),
}


@pytest.mark.parametrize("mode", ["", "multi-krum", "private", "held"])
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_a_hostile_first_update_is_refused_and_the_round_closes_without_it(mode: str, hostile: str) -> None:
    without = Driven(4, mode=mode)
    without.open()
    for index in (1, 2, 3):
        without.send(index, delta_frame(index, honest(index)))
    expected = without.close()

    driven = Driven(4, mode=mode)
    driven.open()
    make, says = HOSTILE[hostile]
    driven.send(0, make())  # first in: its layout must not become the round's
    for index in (1, 2, 3):
        driven.send(index, delta_frame(index, honest(index)))
    (refusal,) = driven.rejected
    assert refusal.peer == b"c0" and refusal.code == "invalid-update" and says in refusal.reason
    assert driven.close() == expected
    assert driven.committed == ["c1", "c2", "c3"]
