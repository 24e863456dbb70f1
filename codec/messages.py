"""The messages of the round protocol, as frozen dataclasses, and their wire field tables.

Every message carries `run_id`, `round` and `sender`; its class gives `kind` (a name) and `kind_code` (the byte on
the wire), and `version` is PROTOCOL_VERSION. `HEADER_FIELDS` lists, per class, each further attribute with its
msgpack key and value type, in wire order: these travel in the packet's uncompressed header. Task and Update also
have a body (`BODY_FIELDS`: the tensor groups and the algorithm's own `meta`), which travels as one zstd frame after
the header. The runtime's fields are typed attributes of their message; `meta` belongs to the algorithm alone.
packet.py encodes and decodes from these tables, and docs/wire-format.md section 3 is their prose form. Every
message checks its fields when it is built, so a decoded message is as valid as one built in code.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedge.codec import vocabulary
from fedge.codec.errors import Malformed
from fedge.codec.fields import (
    MAX_LIST_ITEMS,
    MAX_TEXT_BYTES,
    _check_int,
    _check_text,
    check_fields,
    check_value,
    plain_data,
)
from fedge.codec.tensors import TensorGroup

__all__ = ["MAX_LIST_ITEMS", "MAX_TEXT_BYTES", "PROTOCOL_VERSION", "plain_data"]

PROTOCOL_VERSION = 4
SPOKEN_VERSIONS = (4,)  # the wire-format versions this codec speaks (a Hello says them)


@dataclass(frozen=True)
class MessageBase:
    run_id: str
    round: int
    sender: str

    version: ClassVar[int] = PROTOCOL_VERSION
    kind: ClassVar[str] = ""
    kind_code: ClassVar[int] = 0

    def __post_init__(self) -> None:
        _check_text(self.run_id, "run_id")
        _check_text(self.sender, "sender")
        _check_int(self.round, "round")
        for attr, _key, kind in HEADER_FIELDS[type(self)] + BODY_FIELDS.get(type(self), ()):
            object.__setattr__(self, attr, check_value(kind, getattr(self, attr), attr))


def _empty() -> Any:
    return field(default_factory=dict)


@dataclass(frozen=True)
class Hello(MessageBase):
    """Agent -> coordinator: registration, with what the agent runs, holds and can do.

    ``versions``: the wire-format versions the agent speaks. ``holds``: (run id, round) of the task the agent is
    training or whose outcome it has not sent yet, or None: a coordinator re-sends the round's task after a
    re-hello only to an agent that holds none of the current round."""

    fedge_version: str
    versions: tuple[int, ...]
    torch_version: str
    model_hash: str
    capabilities: tuple[str, ...]
    dataset_size: int
    device: str = ""
    input_shape: tuple[int, ...] = ()
    num_outputs: int = 0
    holds: tuple[str, int] | None = None
    kind: ClassVar[str] = "hello"
    kind_code: ClassVar[int] = 1


@dataclass(frozen=True)
class Welcome(MessageBase):
    """Coordinator -> agent: registration accepted, with the session's settings, each typed and checked.

    ``model``: the model spec (``vocabulary.MODEL_FIELDS``); ``train``: the local training settings
    (``vocabulary.TRAIN_FIELDS``); ``algorithm`` and ``algorithm_options``: the algorithm's name and options;
    ``plugins``: per kind (model, loss, data), the distribution and version of the plugin the session names;
    ``normalization``: ``{"mean": [...], "std": [...]}`` or empty (agents use their shards' statistics)."""

    client_index: int
    num_clients: int
    seed: int
    model_hash: str
    model: Mapping[str, Any]
    algorithm: str
    algorithm_options: Mapping[str, Any]
    train: Mapping[str, Any]
    heartbeat_s: float
    liveness_s: float
    train_limit: int = 0
    plugins: Mapping[str, Any] = _empty()
    normalization: Mapping[str, Any] = _empty()
    kind: ClassVar[str] = "welcome"
    kind_code: ClassVar[int] = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        for attr, table in (("model", vocabulary.MODEL_FIELDS), ("train", vocabulary.TRAIN_FIELDS)):
            object.__setattr__(self, attr, plain_data(check_fields(table, getattr(self, attr), attr), attr))
        if not self.algorithm:
            raise Malformed("algorithm must name an algorithm")
        if self.client_index >= max(self.num_clients, 1):
            raise Malformed(f"client_index {self.client_index} is not below num_clients {self.num_clients}")
        if self.normalization:
            norm = check_fields({"mean": "floats", "std": "floats"}, self.normalization, "normalization")
            if len(norm["mean"]) != len(norm["std"]) or not norm["mean"]:
                raise Malformed("normalization's mean and std must be non-empty and of one length")
            object.__setattr__(self, "normalization", {k: list(v) for k, v in norm.items()})
        for kind, ref in self.plugins.items():
            if not isinstance(ref, Mapping):
                raise Malformed(f"plugins.{kind} must be a map, got {type(ref).__name__}")


@dataclass(frozen=True)
class Task(MessageBase):
    """Coordinator -> agent: the round's downlink (the algorithm's groups and meta in the body) and the runtime's
    fields: the last committed round, the agent's last accepted round, the seconds left until the round's
    deadline, whether to evaluate the received model (``personal_eval``: for its personal accuracy; ``evaluate``:
    the session has no test set of its own), ``paced``: hold the update until a Grant for this round comes, and
    ``norm_bounds``: the L2 bound the coordinator applies to the change of each update group this round, by group
    name (``*``: every group), empty when none is known before the round closes; ``secagg``: the round's
    secure-aggregation settings (``fields.SECAGG_FIELDS``), or None when the round is not securely aggregated;
    ``base_version``: in an asynchronous session (where ``round`` is the task's id), the model version the task
    trains from, None in rounds; ``attempt``: the device's how-many-th task on that version (0 for the first)."""

    groups: Mapping[str, TensorGroup] = _empty()
    meta: Mapping[str, Any] = _empty()
    committed_round: int = 0
    last_accepted_round: int = 0
    deadline_s: float = 0.0
    personal_eval: bool = False
    evaluate: bool = False
    paced: bool = False
    norm_bounds: Mapping[str, float] = _empty()
    secagg: Mapping[str, Any] | None = None
    base_version: int | None = None
    attempt: int = 0
    kind: ClassVar[str] = "task"
    kind_code: ClassVar[int] = 3


@dataclass(frozen=True)
class Update(MessageBase):
    """Agent -> coordinator: the round's uplink (the algorithm's groups and meta in the body) and the runtime's
    fields: samples trained on, optimizer steps, mean training loss, training seconds, the evaluation asked for
    (``evaluation``: metric name to value, over ``eval_samples`` test samples; ``personal_accuracy``), the
    meter's record of the round (``record``: a flat map), and ``clip_scale``: the factor the device scaled its
    update by to fit the task's norm bounds (1: untouched; recorded, never trusted). The header travels outside the compressed body, so the
    body is encoded once and the record can describe it."""

    groups: Mapping[str, TensorGroup] = _empty()
    meta: Mapping[str, Any] = _empty()
    num_samples: int = 0
    steps: int = 0
    train_loss: float = 0.0
    train_s: float = 0.0
    evaluation: Mapping[str, Any] = _empty()
    eval_samples: int = 0
    personal_accuracy: float | None = None
    record: Mapping[str, Any] = _empty()
    clip_scale: float = 1.0
    kind: ClassVar[str] = "update"
    kind_code: ClassVar[int] = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        for what, value in (("evaluation", self.evaluation), ("record", self.record)):
            for key, item in value.items():
                if isinstance(item, (list, dict)):
                    raise Malformed(f"{what}.{key} must be a scalar, got {type(item).__name__}")


@dataclass(frozen=True)
class Commit(MessageBase):
    """Coordinator -> agent: the round's aggregate is final, with this agent's update in it (persist its state)."""

    kind: ClassVar[str] = "commit"
    kind_code: ClassVar[int] = 5


@dataclass(frozen=True)
class Heartbeat(MessageBase):
    """Either direction: still alive. From an agent: the round it holds (the header's round, 0 for none), the
    training steps taken in it, and ``ready``: its update waits for a Grant."""

    steps: int = 0
    ready: bool = False
    kind: ClassVar[str] = "heartbeat"
    kind_code: ClassVar[int] = 6


@dataclass(frozen=True)
class ErrorMessage(MessageBase):
    """Either direction: a request failed; `code` is one of vocabulary's codes, `reason` is for people."""

    code: str
    reason: str
    kind: ClassVar[str] = "error"
    kind_code: ClassVar[int] = 7


@dataclass(frozen=True)
class Bye(MessageBase):
    """Either direction: the sender leaves; `code` says how (vocabulary.BYE_FINISHED: the session is over),
    `reason` is for people."""

    code: str
    reason: str
    kind: ClassVar[str] = "bye"
    kind_code: ClassVar[int] = 8


@dataclass(frozen=True)
class Cancel(MessageBase):
    """Coordinator -> agent: stop training the header's round and send nothing for it."""

    reason: str
    kind: ClassVar[str] = "cancel"
    kind_code: ClassVar[int] = 9


@dataclass(frozen=True)
class Grant(MessageBase):
    """Coordinator -> agent: send the held update of the header's round now (uploads of a paced task)."""

    kind: ClassVar[str] = "grant"
    kind_code: ClassVar[int] = 10


@dataclass(frozen=True)
class SecAggKeys(MessageBase):
    """Agent -> coordinator, secure aggregation's first stage (docs/secure-aggregation.md): the device's two
    X25519 public keys for round ``round``'s attempt ``attempt`` and its 32-byte commitment to its self-mask seed
    (in the body: they are bytes)."""

    attempt: int = 0
    channel_key: bytes = b""
    masking_key: bytes = b""
    seed_digest: bytes = b""
    kind: ClassVar[str] = "secagg-keys"
    kind_code: ClassVar[int] = 11


@dataclass(frozen=True)
class SecAggRoster(MessageBase):
    """Coordinator -> agent: every device that advertised its keys, with them (device, channel key, masking key)."""

    attempt: int = 0
    keys: tuple[tuple[str, bytes, bytes], ...] = ()
    kind: ClassVar[str] = "secagg-roster"
    kind_code: ClassVar[int] = 12


@dataclass(frozen=True)
class SecAggShares(MessageBase):
    """Agent -> coordinator: the device's sealed shares, one per neighbour (receiver, sealed bytes)."""

    attempt: int = 0
    shares: tuple[tuple[str, bytes], ...] = ()
    kind: ClassVar[str] = "secagg-shares"
    kind_code: ClassVar[int] = 13


@dataclass(frozen=True)
class SecAggDelivery(MessageBase):
    """Coordinator -> agent: the sealed shares addressed to the device, from the devices that shared (sender,
    sealed bytes)."""

    attempt: int = 0
    shares: tuple[tuple[str, bytes], ...] = ()
    kind: ClassVar[str] = "secagg-delivery"
    kind_code: ClassVar[int] = 14


@dataclass(frozen=True)
class SecAggUnmask(MessageBase):
    """Coordinator -> agent: the devices whose masked input is in the sum (``survivors``) and those that shared
    but sent none (``dropped``); never a device in both."""

    attempt: int = 0
    survivors: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    kind: ClassVar[str] = "secagg-unmask"
    kind_code: ClassVar[int] = 15


@dataclass(frozen=True)
class SecAggReveal(MessageBase):
    """Agent -> coordinator: its share of each surviving neighbour's self-mask seed (``seeds``) and of each dropped
    neighbour's masking key (``secrets``), as (device, share bytes)."""

    attempt: int = 0
    seeds: tuple[tuple[str, bytes], ...] = ()
    secrets: tuple[tuple[str, bytes], ...] = ()
    kind: ClassVar[str] = "secagg-reveal"
    kind_code: ClassVar[int] = 16


Message = Hello | Welcome | Task | Update | Commit | Heartbeat | ErrorMessage | Bye | Cancel | Grant | SecAggKeys | \
    SecAggRoster | SecAggShares | SecAggDelivery | SecAggUnmask | SecAggReveal

HEADER_FIELDS: dict[type[MessageBase], tuple[tuple[str, str, str], ...]] = {
    Hello: (("fedge_version", "fv", "str"), ("versions", "vs", "ints"), ("torch_version", "tv", "str"),
            ("model_hash", "mh", "str"), ("capabilities", "cap", "strs"), ("dataset_size", "ds", "int"),
            ("device", "dev", "str"), ("input_shape", "ish", "ints"), ("num_outputs", "no", "int"),
            ("holds", "hold", "hold")),
    Welcome: (("client_index", "ci", "int"), ("num_clients", "nc", "int"), ("seed", "seed", "int"),
              ("model_hash", "mh", "str"), ("model", "mod", "map"), ("algorithm", "alg", "str"),
              ("algorithm_options", "ao", "map"), ("train", "tr", "map"), ("heartbeat_s", "hb", "float"),
              ("liveness_s", "lv", "float"), ("train_limit", "lim", "int"), ("plugins", "plg", "map"),
              ("normalization", "nrm", "map")),
    Task: (("committed_round", "cr", "int"), ("last_accepted_round", "la", "int"), ("deadline_s", "dl", "float"),
           ("personal_eval", "pe", "bool"), ("evaluate", "ev", "bool"), ("paced", "pace", "bool"),
           ("norm_bounds", "nb", "bounds"), ("secagg", "sa", "secagg"), ("base_version", "bv", "optint"),
           ("attempt", "at", "int")),
    Update: (("num_samples", "n", "int"), ("steps", "st", "int"), ("train_loss", "tl", "float"),
             ("train_s", "ts", "float"), ("evaluation", "ev", "map"), ("eval_samples", "es", "int"),
             ("personal_accuracy", "pa", "optfloat"), ("record", "rec", "map"), ("clip_scale", "cs", "fraction")),
    Commit: (),
    Heartbeat: (("steps", "st", "int"), ("ready", "rdy", "bool")),
    ErrorMessage: (("code", "code", "code"), ("reason", "why", "str")),
    Bye: (("code", "code", "code"), ("reason", "why", "str")),
    Cancel: (("reason", "why", "str"),),
    Grant: (),
    SecAggKeys: (("attempt", "at", "int"),),
    SecAggRoster: (("attempt", "at", "int"),),
    SecAggShares: (("attempt", "at", "int"),),
    SecAggDelivery: (("attempt", "at", "int"),),
    SecAggUnmask: (("attempt", "at", "int"),),
    SecAggReveal: (("attempt", "at", "int"),),
}
# The body of a Task or an Update is its tensor groups and meta (``packet.encode_body``); a secure-aggregation
# message's body is the map of its fields below (bytes may not travel in the header).
BODY_FIELDS: dict[type[MessageBase], tuple[tuple[str, str, str], ...]] = {
    Task: (("groups", "g", "groups"), ("meta", "m", "meta")),
    Update: (("groups", "g", "groups"), ("meta", "m", "meta")),
    SecAggKeys: (("channel_key", "ck", "key"), ("masking_key", "mk", "key"), ("seed_digest", "sd", "key")),
    SecAggRoster: (("keys", "keys", "keyring"),),
    SecAggShares: (("shares", "sh", "sealed"),),
    SecAggDelivery: (("shares", "sh", "sealed"),),
    SecAggUnmask: (("survivors", "sv", "names"), ("dropped", "dr", "names")),
    SecAggReveal: (("seeds", "sd", "sealed"), ("secrets", "sc", "sealed")),
}
KINDS: dict[int, type[MessageBase]] = {cls.kind_code: cls for cls in HEADER_FIELDS}

