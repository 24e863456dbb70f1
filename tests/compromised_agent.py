"""A compromised edge agent, for the attack harness's real-process cells and tests: the stock agent, with its Update
packet rewritten by one of tests/attackers.py's attacks (or, named ``hostile:<mutation>``, by one of tests/hostile.py's
structural mutations) after its honest training. Never installed on a device.

    python -m tests.compromised_agent inflate-flip run --coordinator tcp://127.0.0.1:5555 --client-id pi-0 ...
    python -m tests.compromised_agent hostile:empty-sparse-section run --coordinator ... --client-id pi-0 ...
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

from fedge import codec
from fedge.edge_agent import agent as stock
from tests.attackers import ATTACKS
from tests.hostile import mutation


def main(argv: list[str]) -> int:
    honest = stock.update_frame
    if argv[0].startswith("hostile:"):  # a structural mutation of tests/hostile.py (its first frame)
        hostile = mutation(argv[0].split(":", 1)[1])

        def update_frame(*args: Any, **kwargs: Any) -> bytes:
            return hostile.make(honest(*args, **kwargs), [])[0]
    else:
        attack = ATTACKS[argv[0]]()

        def update_frame(*args: Any, **kwargs: Any) -> bytes:
            update = codec.decode(honest(*args, **kwargs))
            assert isinstance(update, codec.Update)
            return codec.encode(attack(update))

    stock.update_frame = update_frame  # type: ignore[assignment]
    sys.argv = ["edge-agent", *argv[1:]]
    runpy.run_module("fedge.edge_agent", run_name="__main__")  # the agent's own entry point (it exits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
