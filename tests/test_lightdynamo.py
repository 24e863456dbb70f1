"""The agent's stand-in for torch._dynamo (fedge.edge_agent.lightdynamo): training with torch.optim and the meter's
FLOP count give the same bits and figures with it (in a fresh interpreter) as without it (the same program in this
process, where the real torch._dynamo is loaded), sympy and the real torch._dynamo stay unloaded, and asking it for
anything else loads the real module."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

PROGRAM = """
import hashlib, sys
import torch


def main(mode):
    if mode == "light":
        from fedge.edge_agent.lightdynamo import install
        assert install()
    torch.set_num_threads(1)
    from fedge.algorithms import make_client
    from fedge.algorithms.loop import TrainSettings, train_local
    from fedge.meter import FlopCounter
    from fedge.models import ModelSpec, build, state_to_arrays
    torch.manual_seed(0)
    model = build(ModelSpec("cnn-bn", (1, 16, 16)), seed=0)
    flops = FlopCounter().forward_backward(model, (1, 16, 16), 32).total
    inputs, labels = torch.randn(96, 1, 16, 16), torch.randint(0, 10, (96,))
    for optimizer in ("adam", "sgd"):
        client = make_client("fedprox", {"mu": 0.01}, 0)
        train_local(model, client, inputs, labels, TrainSettings(epochs=2, batch_size=32, lr=1e-2,
                                                                 optimizer=optimizer,
                                                                 momentum=0.9 if optimizer == "sgd" else 0.0), 7)
    digest = hashlib.sha256()
    for name, value in sorted(state_to_arrays(model).items()):
        digest.update(name.encode() + value.tobytes())
    dynamo = sys.modules.get("torch._dynamo")
    return {"hash": digest.hexdigest(), "flops": flops, "sympy": "sympy" in sys.modules,
            "dynamo": type(dynamo).__name__ if dynamo else None}
"""


def run(mode: str) -> dict[str, object]:
    """PROGRAM's ``main(mode)`` in a fresh interpreter."""
    code = PROGRAM + "\nimport json\nprint(json.dumps(main(sys.argv[1])))\n"
    out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def here() -> dict[str, object]:
    """PROGRAM's ``main("real")`` in this process (torch on one thread, the real torch._dynamo loaded)."""
    namespace: dict[str, Any] = {}
    exec(PROGRAM, namespace)  # noqa: S102 - the test's own program, run as the fresh interpreter runs it
    result: dict[str, object] = namespace["main"]("real")
    return result


def test_training_and_flop_counts_are_identical_with_the_stand_in() -> None:
    real, light = here(), run("light")
    assert real["dynamo"] == "module" and real["sympy"] is True
    assert light["dynamo"] == "LightDynamo" and light["sympy"] is False
    assert light["hash"] == real["hash"] and light["flops"] == real["flops"]


def test_anything_else_loads_the_real_module() -> None:
    code = ("import sys, torch\nfrom fedge.edge_agent.lightdynamo import LightDynamo, install\nassert install()\n"
            "config = torch._dynamo.config\n"
            "print(type(sys.modules['torch._dynamo']).__name__, isinstance(torch._dynamo, LightDynamo), "
            "hasattr(config, 'cache_size_limit'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["module", "False", "True"], out.stdout
