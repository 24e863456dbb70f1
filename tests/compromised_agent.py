"""A compromised edge agent, for the attack harness's real-process cell and tests: the stock agent, with its Update
packet rewritten by one of tests/attackers.py's attacks after its honest training. Never installed on a device.

    python -m tests.compromised_agent inflate-flip run --coordinator tcp://127.0.0.1:5555 --client-id pi-0 ...
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

from fedge import codec
from fedge.edge_agent import agent as stock
from tests.attackers import ATTACKS


def main(argv: list[str]) -> int:
    attack = ATTACKS[argv[0]]()
    honest = stock.update_frame

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
