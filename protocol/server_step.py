"""The server step: how a round's aggregate moves the global model, the same for synchronous and asynchronous rounds
(``[server]``: ``lr``, ``momentum``). With the defaults (lr 1, no momentum) the model is the aggregate itself,
bit for bit; otherwise, with d the aggregate's change of the global model x, v <- momentum v + d and
x <- x + lr v (server SGD with momentum, Reddi et al. 2021's FedAvgM). Its velocity is checkpointed with the session.
Applies to server halves that keep one global model (``GlobalModelServer``). Pure numpy: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedge.protocol.payload import Arrays

PREFIX = "server_step/"  # the velocity's arrays in the checkpoint


@dataclass
class ServerStep:
    lr: float = 1.0
    momentum: float = 0.0
    velocity: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.lr != 1.0 or self.momentum != 0.0

    def apply(self, before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray]) -> Arrays:
        """The global model after the step, from the model before the round and the aggregate's model; integer
        tensors are the aggregate's."""
        stepped: Arrays = {}
        for name, value in after.items():
            if value.dtype.kind != "f" or name not in before:
                stepped[name] = value
                continue
            start = np.asarray(before[name], np.float64)
            change = np.asarray(value, np.float64) - start
            previous = self.velocity.get(name)
            velocity = change if previous is None or self.momentum == 0 else \
                self.momentum * previous.astype(np.float64) + change
            self.velocity[name] = velocity.astype(np.float32)
            stepped[name] = (start + self.lr * velocity).astype(value.dtype)
        return stepped

    def state_dict(self) -> Arrays:
        return {PREFIX + name: value for name, value in self.velocity.items()}

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.velocity = {name[len(PREFIX):]: np.array(value) for name, value in arrays.items()
                         if name.startswith(PREFIX)}
