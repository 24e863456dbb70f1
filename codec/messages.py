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
from fedge.codec.schema import MAX_I64, check_name, is_int
from fedge.codec.tensors import TensorGroup

PROTOCOL_VERSION = 3
SPOKEN_VERSIONS = (3,)  # the wire-format versions this codec speaks (a Hello says them)
MAX_TEXT_BYTES = 65536
MAX_LIST_ITEMS = 1024
MAX_MAP_DEPTH = 32


def _check_text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT_BYTES or len(value.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise Malformed(f"{what} must be a string of at most {MAX_TEXT_BYTES} UTF-8 bytes, got {value!r:.80}")
    return value


def _check_int(value: Any, what: str) -> int:
    if not is_int(value) or not 0 <= value <= MAX_I64:
        raise Malformed(f"{what} must be an int in [0, 2**63 - 1], got {value!r:.40}")
    return int(value)


def _check_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Malformed(f"{what} must be a number, got {value!r:.40}")
    return float(value)


def _check_items(value: Any, what: str) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise Malformed(f"{what} must be a sequence, got {value!r:.80}")
    items = tuple(value)
    if len(items) > MAX_LIST_ITEMS:
        raise Malformed(f"{what} holds at most {MAX_LIST_ITEMS} items, got {len(items)}")
    return items


def plain_data(value: Any, where: str = "meta", depth: int = 0) -> Any:
    """`value` made of str, int, float, bool, None, lists and str-keyed maps; returns it as plain data (tuples
    become lists)."""
    if depth > MAX_MAP_DEPTH:
        raise Malformed(f"{where}: nested deeper than {MAX_MAP_DEPTH} levels")
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise Malformed(f"{where}: integer {value} does not fit in 64 bits")
        return value
    if isinstance(value, (list, tuple)):
        return [plain_data(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise Malformed(f"{where}: map keys must be strings, got {key!r:.40}")
            out[key] = plain_data(item, f"{where}.{key}", depth + 1)
        return out
    raise Malformed(f"{where}: {type(value).__name__} is not a msgpack-native value "
                    f"(use str, int, float, bool, None, list or dict)")


def check_value(kind: str, value: Any, what: str) -> Any:
    """`value` checked against a field type of the tables below, in its canonical Python form."""
    if kind == "str":
        return _check_text(value, what)
    if kind == "code":
        if not isinstance(value, str) or not vocabulary.CODE_PATTERN.fullmatch(value):
            raise Malformed(f"{what} must be a code of 1-64 characters a-z, 0-9 and '-', got {value!r:.80}")
        return value
    if kind == "int":
        return _check_int(value, what)
    if kind == "float":
        return _check_float(value, what)
    if kind == "optfloat":
        return None if value is None else _check_float(value, what)
    if kind == "bool":
        if not isinstance(value, bool):
            raise Malformed(f"{what} must be true or false, got {value!r:.40}")
        return value
    if kind == "strs":
        return tuple(_check_text(item, f"an item of {what}") for item in _check_items(value, what))
    if kind == "ints":
        return tuple(_check_int(item, f"an item of {what}") for item in _check_items(value, what))
    if kind == "floats":
        return tuple(_check_float(item, f"an item of {what}") for item in _check_items(value, what))
    if kind == "hold":
        if value is None:
            return None
        pair = _check_items(value, what)
        if len(pair) != 2:
            raise Malformed(f"{what} must be nil or [run id, round], got {value!r:.80}")
        return (_check_text(pair[0], f"{what}'s run id"), _check_int(pair[1], f"{what}'s round"))
    if kind in ("map", "meta"):
        if not isinstance(value, Mapping):
            raise Malformed(f"{what} must be a map with string keys, got {type(value).__name__}")
        return plain_data(value, what)
    if kind == "groups":
        if not isinstance(value, Mapping):
            raise Malformed(f"{what} must be a mapping of name to TensorGroup, got {type(value).__name__}")
        for name, group in value.items():
            check_name(name, "group name")
            if not isinstance(group, TensorGroup):
                raise Malformed(f"group {name!r} must be a TensorGroup, got {type(group).__name__}")
        return dict(value)
    raise AssertionError(f"unknown field type {kind}")


def check_fields(table: Mapping[str, str], value: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A map with exactly the keys of `table`, each of its type."""
    missing = sorted(set(table) - set(value))
    extra = sorted(set(value) - set(table))
    if missing or extra:
        raise Malformed(f"{what}: keys differ from the format (missing {missing}, unexpected {extra})")
    return {key: check_value(kind, value[key], f"{what}.{key}") for key, kind in table.items()}


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
    the session has no test set of its own), and ``paced``: hold the update until a Grant for this round comes."""

    groups: Mapping[str, TensorGroup] = _empty()
    meta: Mapping[str, Any] = _empty()
    committed_round: int = 0
    last_accepted_round: int = 0
    deadline_s: float = 0.0
    personal_eval: bool = False
    evaluate: bool = False
    paced: bool = False
    kind: ClassVar[str] = "task"
    kind_code: ClassVar[int] = 3


@dataclass(frozen=True)
class Update(MessageBase):
    """Agent -> coordinator: the round's uplink (the algorithm's groups and meta in the body) and the runtime's
    fields: samples trained on, optimizer steps, mean training loss, training seconds, the evaluation asked for
    (``evaluation``: metric name to value, over ``eval_samples`` test samples; ``personal_accuracy``), and the
    meter's record of the round (``record``: a flat map). The header travels outside the compressed body, so the
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


Message = Hello | Welcome | Task | Update | Commit | Heartbeat | ErrorMessage | Bye | Cancel | Grant

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
           ("personal_eval", "pe", "bool"), ("evaluate", "ev", "bool"), ("paced", "pace", "bool")),
    Update: (("num_samples", "n", "int"), ("steps", "st", "int"), ("train_loss", "tl", "float"),
             ("train_s", "ts", "float"), ("evaluation", "ev", "map"), ("eval_samples", "es", "int"),
             ("personal_accuracy", "pa", "optfloat"), ("record", "rec", "map")),
    Commit: (),
    Heartbeat: (("steps", "st", "int"), ("ready", "rdy", "bool")),
    ErrorMessage: (("code", "code", "code"), ("reason", "why", "str")),
    Bye: (("code", "code", "code"), ("reason", "why", "str")),
    Cancel: (("reason", "why", "str"),),
    Grant: (),
}
BODY_FIELDS: dict[type[MessageBase], tuple[tuple[str, str, str], ...]] = {
    Task: (("groups", "g", "groups"), ("meta", "m", "meta")),
    Update: (("groups", "g", "groups"), ("meta", "m", "meta")),
}
KINDS: dict[int, type[MessageBase]] = {cls.kind_code: cls for cls in HEADER_FIELDS}

