"""What a round carries between the runtime and an algorithm's halves, torch-free: ``Payload`` (named codec tensor
groups and a metadata map, one direction for one client), ``ClientUpdate`` (one decoded update as a server half
sees it), ``Arrays`` (named numpy arrays) and the group names of the built-in algorithms. The protocol objects and
the algorithms both use these; imports only numpy and the codec (never torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedge.codec import TensorGroup

Arrays = dict[str, np.ndarray]

# The group names of the built-in algorithms: the model, a model update as a difference, and anything else a base
# sends beside them (SCAFFOLD's "control"). DSSA and ef read their base's payloads through these names.
MODEL_GROUP = "model"
DELTA_GROUP = "delta"
UPDATE_GROUPS = (MODEL_GROUP, DELTA_GROUP)
# A task's published uplink support (ef-shared): a mask on which every device of the round sends its values; secure
# aggregation masks those coordinates. A securely aggregated round's mean names the client indices summed in it under
# SECURE_CONTRIBUTORS in its meta (the devices' own meta never reaches the coordinator then).
SUPPORT_GROUP = "support"
SECURE_CONTRIBUTORS = "secure_contributors"


@dataclass(frozen=True)
class Payload:
    """What travels in one direction for one client: named tensor groups and a metadata map."""

    groups: Mapping[str, TensorGroup] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientUpdate:
    """One decoded update as the server half sees it: whose (client id and index), its claimed sample count, its
    payload, and the factor the device says it scaled it by to fit the task's norm bounds (its own word: recorded,
    and read only as differential privacy's clip bit, whose noise bounds what a lie can do). In an asynchronous
    session the coordinator, never the device, sets ``discount``, the staleness weight s(tau) its values count
    with, and ``counted``, what its weight adds to the mean's divisor (``protocol.asynchronous``); both are 1
    otherwise."""

    client_id: str
    index: int
    num_samples: int
    payload: Payload
    clip_scale: float = 1.0
    discount: float = 1.0
    counted: float = 1.0
