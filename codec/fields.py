"""The value types of message fields: each checked, and brought to its canonical Python form, by ``check_value``.

Types: ``str`` (UTF-8, at most 64 KiB), ``code`` (``vocabulary.CODE_PATTERN``), ``int`` (0 ... 2^63 - 1),
``optint`` (None or an int), ``float``, ``optfloat``, ``bool``, ``strs`` / ``ints`` / ``floats`` (at most 1,024 items), ``hold`` (None or
[run id, round]), ``fraction`` (a number in [0, 1]), ``bounds`` (at most 64 names to finite numbers above 0),
``map`` / ``meta`` (plain msgpack-native data, ``plain_data``), ``groups`` (name to ``TensorGroup``), ``secagg``
(None, or a Task's secure-aggregation settings, ``SECAGG_FIELDS``), and the secure-aggregation bodies' types:
``key`` (32 bytes), ``keyring`` (at most 4,096 [device, key, key], devices distinct), ``sealed`` (at most 4,096
[device, bytes of at most 1 KiB]) and ``names`` (at most 4,096 device ids). ``check_fields`` checks a map with
exactly the keys of a table. Every failure is ``Malformed``.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedge.codec import vocabulary
from fedge.codec.errors import Malformed
from fedge.codec.schema import MAX_I64, check_name, is_int
from fedge.codec.tensors import TensorGroup

MAX_TEXT_BYTES = 65536
MAX_LIST_ITEMS = 1024
MAX_MAP_DEPTH = 32
MAX_BOUNDS = 64
MAX_BODY_ITEMS = 4096   # devices named in one secure-aggregation body
KEY_BYTES = 32          # an X25519 public key
MAX_SEALED_BYTES = 1024  # one sealed share, or one share's bytes
# A Task's secure-aggregation settings (``secagg``, key ``sa``): the field's width, the levels each value is
# quantised to, the clip range per float tensor (in the model's order), the threshold fraction, the size up to
# which the neighbour graph is complete, the graph's seed and the attempt (a round redone after a restart).
SECAGG_FIELDS = {"bits": "int", "levels": "int", "clip": "floats", "threshold": "fraction", "neighbours": "int",
                 "seed": "int", "attempt": "int"}
# ... and, under distributed noise only, ``dp``: the L2 clip, the scale of the rounded rotation, each device's noise
# variance (integer units), the rotation's seed and the fewest inputs whose sum may be unmasked.
SECAGG_NOISE_FIELDS = {"clip": "float", "scale": "float", "noise": "float", "rotation": "int", "release": "int"}


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
    if kind == "optint":
        return None if value is None else _check_int(value, what)
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
    if kind == "fraction":
        fraction = _check_float(value, what)
        if not 0.0 <= fraction <= 1.0:
            raise Malformed(f"{what} must be a number in [0, 1], got {value!r:.40}")
        return fraction
    if kind == "bounds":
        if not isinstance(value, Mapping) or len(value) > MAX_BOUNDS:
            raise Malformed(f"{what} must be a map of at most {MAX_BOUNDS} group names to bounds, got {value!r:.80}")
        bounds = {}
        for name, bound in value.items():
            checked = _check_float(bound, f"{what}[{name!r:.40}]")
            if not math.isfinite(checked) or checked <= 0:
                raise Malformed(f"{what}[{name!r:.40}] must be a finite number above 0, got {bound!r:.40}")
            bounds[_check_text(name, f"a key of {what}")] = checked
        return bounds
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
    if kind == "secagg":
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise Malformed(f"{what} must be nil or a map of the secure-aggregation settings, got {value!r:.80}")
        settings = check_fields(SECAGG_FIELDS, {k: v for k, v in value.items() if k != "dp"}, what)
        if "dp" in value:
            noise = value["dp"]
            if not isinstance(noise, Mapping):
                raise Malformed(f"{what}.dp must be a map of the distributed noise's settings, got {noise!r:.80}")
            return {**settings, "dp": check_fields(SECAGG_NOISE_FIELDS, noise, f"{what}.dp")}
        return settings
    if kind == "key":
        return _check_bytes(value, what, KEY_BYTES, KEY_BYTES)
    if kind == "keyring":
        ring = tuple((_check_text(device, f"a device of {what}"), _check_bytes(a, f"{what}'s channel key", KEY_BYTES,
                                                                               KEY_BYTES),
                      _check_bytes(b, f"{what}'s masking key", KEY_BYTES, KEY_BYTES))
                     for device, a, b in _check_entries(value, what, 3))
        if len({device for device, _, _ in ring}) != len(ring):
            raise Malformed(f"{what} names a device twice")
        return ring
    if kind == "sealed":
        return tuple((_check_text(device, f"a device of {what}"),
                      _check_bytes(data, f"{what}'s bytes", 1, MAX_SEALED_BYTES))
                     for device, data in _check_entries(value, what, 2))
    if kind == "names":
        return tuple(_check_text(device, f"a device of {what}") for device in _check_entries(value, what, 0))
    raise AssertionError(f"unknown field type {kind}")


def _check_bytes(value: Any, what: str, least: int, most: int) -> bytes:
    if not isinstance(value, (bytes, bytearray)) or not least <= len(value) <= most:
        raise Malformed(f"{what} must be {least}" + (f" to {most}" if most != least else "") +
                        f" bytes, got {value!r:.40}")
    return bytes(value)


def _check_entries(value: Any, what: str, width: int) -> tuple[Any, ...]:
    """A body list of at most ``MAX_BODY_ITEMS`` items, each a sequence of ``width`` items (0: any item)."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise Malformed(f"{what} must be a sequence, got {value!r:.80}")
    items = tuple(value)
    if len(items) > MAX_BODY_ITEMS:
        raise Malformed(f"{what} holds at most {MAX_BODY_ITEMS} items, got {len(items)}")
    if width and any(isinstance(item, (str, bytes, Mapping)) or not hasattr(item, "__len__") or len(item) != width
                     for item in items):
        raise Malformed(f"each item of {what} must be a list of {width}")
    return items


def check_fields(table: Mapping[str, str], value: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A map with exactly the keys of `table`, each of its type."""
    missing = sorted(set(table) - set(value))
    extra = sorted(set(value) - set(table))
    if missing or extra:
        raise Malformed(f"{what}: keys differ from the format (missing {missing}, unexpected {extra})")
    return {key: check_value(kind, value[key], f"{what}.{key}") for key, kind in table.items()}
