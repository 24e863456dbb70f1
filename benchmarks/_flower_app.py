"""The Flower App that benchmarks/vs_flower.py runs: its pyproject, ServerApp and ClientApp, written to a folder.

The ServerApp runs Flower's FedAvg over the model's initial arrays for R rounds (every node trains every round, no
evaluation) and notes the time at each round's end; the ClientApp loads the received arrays into the model (torch),
optionally takes one Adam step on one batch, and sends the model's state back. Only the generated files import
flwr; this module writes text and imports nothing of Flower's or Fedge's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedgebench"
version = "1.0.0"
description = "Fedge's side-by-side benchmark app"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedge"

[tool.flwr.app.components]
serverapp = "fedgebench.server_app:app"
clientapp = "fedgebench.client_app:app"

[tool.flwr.app.config]
rounds = {rounds}
nodes = {nodes}
spec = '{spec}'
initial = "{initial}"
ends = "{ends}"
work = "{work}"
"""

SERVER_APP = '''\
"""The benchmark's ServerApp: Flower's FedAvg over the model's initial arrays; notes the time at each round end."""
import json
import time

import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    with np.load(config["initial"]) as saved:
        arrays = ArrayRecord({name: torch.from_numpy(saved[name]) for name in saved.files})

    def round_end(server_round: int, _arrays: ArrayRecord) -> None:
        with open(config["ends"], "a") as out:
            out.write(json.dumps({"round": server_round, "time": time.time()}) + "\\n")

    nodes = int(config["nodes"])
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=int(config["rounds"]), evaluate_fn=round_end)
'''

CLIENT_APP = '''\
"""The benchmark's ClientApp: the received arrays loaded into the model, optionally one step, and sent back."""
import json

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedge.models import ModelSpec, build

app = ClientApp()
MODEL = None


@app.train()
def train(msg: Message, context: Context) -> Message:
    global MODEL
    spec = ModelSpec.from_dict(json.loads(context.run_config["spec"]))
    if MODEL is None:
        MODEL = build(spec)
    MODEL.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    if context.run_config["work"] == "step":  # one Adam step on one batch, as Fedge's agents take
        generator = torch.Generator().manual_seed(int(context.node_id) % 2**31)
        inputs = torch.rand((64, *spec.input_shape), generator=generator)
        labels = torch.randint(0, spec.num_classes, (64,), generator=generator)
        optimizer = torch.optim.Adam(MODEL.parameters(), lr=1e-3)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(MODEL(inputs), labels).backward()
        optimizer.step()
    content = RecordDict({"arrays": ArrayRecord(MODEL.state_dict()), "metrics": MetricRecord({"num-examples": 64})})
    return Message(content=content, reply_to=msg)
'''


def write_app(app: Path, *, rounds: int, nodes: int, spec: dict[str, Any], initial: Path, ends: Path,
              work: str) -> None:
    """Write the App into ``app`` (a new folder): ``pyproject.toml`` and the package ``fedgebench``."""
    (app / "fedgebench").mkdir(parents=True)
    (app / "pyproject.toml").write_text(PYPROJECT.format(rounds=rounds, nodes=nodes, spec=json.dumps(spec),
                                                         initial=initial, ends=ends, work=work))
    (app / "fedgebench" / "__init__.py").write_text("")
    (app / "fedgebench" / "server_app.py").write_text(SERVER_APP)
    (app / "fedgebench" / "client_app.py").write_text(CLIENT_APP)
