"""The messages of the round protocol, as frozen dataclasses, and their wire field tables.

Every message carries `run_id`, `round` and `sender`; its class gives `kind` (a name) and
`kind_code` (the byte on the wire), and `version` is PROTOCOL_VERSION. `WIRE_FIELDS` lists, per
class, each further attribute with its msgpack key and value type, in wire order; packet.py
encodes and decodes from that table, and docs/wire-format.md section 3 is its prose form.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedge.codec.errors import Malformed
from fedge.codec.schema import MAX_I64, check_name, is_int
from fedge.codec.tensors import TensorGroup

PROTOCOL_VERSION = 2
MAX_TEXT_BYTES = 65536


def _check_text(value: Any, what: str) -> None:
    if not isinstance(value, str) or len(value) > MAX_TEXT_BYTES or len(value.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise Malformed(f"{what} must be a string of at most {MAX_TEXT_BYTES} UTF-8 bytes, got {value!r:.80}")


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
        if not is_int(self.round) or not 0 <= self.round <= MAX_I64:
            raise Malformed(f"round must be an int in [0, 2**63 - 1], got {self.round!r:.40}")
        for attr, _key, kind in WIRE_FIELDS[type(self)]:
            value = getattr(self, attr)
            if kind == "str":
                _check_text(value, attr)
            elif kind == "int" and (not is_int(value) or not 0 <= value <= MAX_I64):
                raise Malformed(f"{attr} must be an int in [0, 2**63 - 1], got {value!r:.40}")
            elif kind == "strs":
                if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                    raise Malformed(f"{attr} must be a sequence of strings, got {value!r:.80}")
                object.__setattr__(self, attr, tuple(value))
                for item in getattr(self, attr):
                    _check_text(item, f"an item of {attr}")
            elif kind == "meta" and not isinstance(value, Mapping):
                raise Malformed(f"meta must be a mapping with string keys, got {type(value).__name__}")
            elif kind == "groups":
                if not isinstance(value, Mapping):
                    raise Malformed(f"groups must be a mapping of name to TensorGroup, got {type(value).__name__}")
                for name, group in value.items():
                    check_name(name, "group name")
                    if not isinstance(group, TensorGroup):
                        raise Malformed(f"group {name!r} must be a TensorGroup, got {type(group).__name__}")


def _empty() -> Any:
    return field(default_factory=dict)


@dataclass(frozen=True)
class Hello(MessageBase):
    """Agent -> coordinator: registration, with what the agent runs and can do."""

    fedge_version: str
    protocol_version: int
    torch_version: str
    model_hash: str
    capabilities: tuple[str, ...]
    dataset_size: int
    meta: Mapping[str, Any] = _empty()
    kind: ClassVar[str] = "hello"
    kind_code: ClassVar[int] = 1


@dataclass(frozen=True)
class Welcome(MessageBase):
    """Coordinator -> agent: registration accepted; session settings in `meta`."""

    meta: Mapping[str, Any] = _empty()
    kind: ClassVar[str] = "welcome"
    kind_code: ClassVar[int] = 2


@dataclass(frozen=True)
class Task(MessageBase):
    """Coordinator -> agent: the round's downlink (model, mask, control variates...)."""

    groups: Mapping[str, TensorGroup] = _empty()
    meta: Mapping[str, Any] = _empty()
    kind: ClassVar[str] = "task"
    kind_code: ClassVar[int] = 3


@dataclass(frozen=True)
class Update(MessageBase):
    """Agent -> coordinator: the round's uplink (update values, control variate deltas...)."""

    groups: Mapping[str, TensorGroup] = _empty()
    meta: Mapping[str, Any] = _empty()
    kind: ClassVar[str] = "update"
    kind_code: ClassVar[int] = 4


@dataclass(frozen=True)
class Commit(MessageBase):
    """Coordinator -> agent: the round's aggregate is final (the agent may persist its state)."""

    meta: Mapping[str, Any] = _empty()
    kind: ClassVar[str] = "commit"
    kind_code: ClassVar[int] = 5


@dataclass(frozen=True)
class Heartbeat(MessageBase):
    """Either direction: still alive (progress or load figures in `meta`)."""

    meta: Mapping[str, Any] = _empty()
    kind: ClassVar[str] = "heartbeat"
    kind_code: ClassVar[int] = 6


@dataclass(frozen=True)
class ErrorMessage(MessageBase):
    """Either direction: a request failed; `code` is machine-readable, `reason` is for people."""

    code: str
    reason: str
    kind: ClassVar[str] = "error"
    kind_code: ClassVar[int] = 7


# The Bye reason that ends an agent's session for good (any other Bye means "I will be back").
SESSION_FINISHED = "session finished"

# Hello meta key: [run_id, round] of the task the agent holds (training it, or its update not yet sent); absent when
# it holds none. A coordinator re-sends the round's task after a re-hello only to an agent that holds none.
HELLO_HOLDS = "holds"

# ErrorMessage codes with which an agent declines a session at its welcome (it will not import a plugin, its data does
# not fit, ...). The coordinator frees the client index the agent took, so that another device can have it.
JOIN_REFUSALS = frozenset({"plugin-refused", "plugin-mismatch", "data-mismatch", "model-mismatch", "model-failed",
                           "no-normalization", "bad-welcome"})


@dataclass(frozen=True)
class Bye(MessageBase):
    """Either direction: the sender leaves the run."""

    reason: str
    kind: ClassVar[str] = "bye"
    kind_code: ClassVar[int] = 8


Message = Hello | Welcome | Task | Update | Commit | Heartbeat | ErrorMessage | Bye

_META = ("meta", "m", "meta")
WIRE_FIELDS: dict[type[MessageBase], tuple[tuple[str, str, str], ...]] = {
    Hello: (("fedge_version", "fv", "str"), ("protocol_version", "pv", "int"), ("torch_version", "tv", "str"),
            ("model_hash", "mh", "str"), ("capabilities", "cap", "strs"), ("dataset_size", "ds", "int"), _META),
    Welcome: (_META,),
    Task: (("groups", "g", "groups"), _META),
    Update: (("groups", "g", "groups"), _META),
    Commit: (_META,),
    Heartbeat: (_META,),
    ErrorMessage: (("code", "code", "str"), ("reason", "why", "str")),
    Bye: (("reason", "why", "str"),),
}
KINDS: dict[int, type[MessageBase]] = {cls.kind_code: cls for cls in WIRE_FIELDS}
