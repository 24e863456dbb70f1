"""The session settings a Welcome carries to client ``index``, from the configuration and the model spec (the
fields of ``codec.Welcome``). No sockets, no algorithms, no torch."""

from __future__ import annotations

from typing import Any

from fedge.coordinator.config import Config
from fedge.models import ModelSpec


def welcome_fields(c: Config, spec: ModelSpec, model_hash: str, index: int, capacity: int) -> dict[str, Any]:
    """The session settings of a Welcome (``codec.Welcome``'s fields): everything an agent needs to build its model
    and client half."""
    return {
        "client_index": index, "num_clients": capacity, "seed": c.run.seed, "model_hash": model_hash,
        "model": spec.as_dict(),
        "algorithm": c.algorithm_name, "algorithm_options": dict(c.algorithm_options),
        "train": {"epochs": c.train.epochs, "batch_size": c.train.batch_size, "lr": c.train.lr,
                  "optimizer": c.train.optimizer, "momentum": c.train.momentum,
                  "weight_decay": c.train.weight_decay, "loss": c.train.loss,
                  "class_weights": list(c.train.class_weights)},
        "train_limit": c.data.train_limit,
        "heartbeat_s": c.fleet.heartbeat_s, "liveness_s": c.fleet.liveness_s,
    }
