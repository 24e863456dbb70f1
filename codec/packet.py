"""Packets: `encode` turns a message into bytes, `decode` turns bytes back into a message.

A packet is an 8-byte prefix (magic "FEDG", version, kind, zero flags) followed by exactly one
zstd frame (content size declared, content checksum on) around one msgpack map, the body.
`decode` checks every size against `Limits` before allocating it, and raises only `CodecError`
subclasses, whatever the input bytes.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import msgpack

from fedge.codec import frames
from fedge.codec.errors import CodecError, Limits, Malformed, TooLarge, UnknownKind, UnsupportedVersion
from fedge.codec.messages import KINDS, MAX_TEXT_BYTES, PROTOCOL_VERSION, WIRE_FIELDS, Message, MessageBase
from fedge.codec.schema import (
    MAX_I64,
    Budget,
    check_name,
    exact_map,
    get_bytes,
    get_int,
    get_list,
    get_str,
)
from fedge.codec.stream import BodyWriter
from fedge.codec.tensors import decode_group, encode_group

MAGIC = b"FEDG"
PREFIX_BYTES = 8
MAX_GROUPS = 256
MAX_LIST_ITEMS = 1024
MAX_META_DEPTH = 32
HEADER_KEYS = ("v", "k", "run", "r", "s")
DEFAULT_LIMITS = Limits()


def check_meta(value: Any, where: str = "meta", depth: int = 0) -> Any:
    """`value` made of str, int, float, bool, None, lists and str-keyed maps; returns it as plain data."""
    if depth > MAX_META_DEPTH:
        raise Malformed(f"{where}: nested deeper than {MAX_META_DEPTH} levels")
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise Malformed(f"{where}: integer {value} does not fit in 64 bits")
        return value
    if isinstance(value, (list, tuple)):
        return [check_meta(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise Malformed(f"{where}: map keys must be strings, got {key!r:.40}")
            out[key] = check_meta(item, f"{where}.{key}", depth + 1)
        return out
    raise Malformed(f"{where}: {type(value).__name__} is not a msgpack-native value "
                    f"(use str, int, float, bool, None, list or dict)")


def _encode_field(kind: str, value: Any) -> Any:
    if kind == "meta":
        return msgpack.packb(check_meta(value), use_bin_type=True)
    if kind == "groups":
        if len(value) > MAX_GROUPS:
            raise TooLarge(f"a message carries at most {MAX_GROUPS} tensor groups, got {len(value)}")
        return {name: encode_group(group) for name, group in value.items()}
    if kind == "strs":
        if len(value) > MAX_LIST_ITEMS:
            raise TooLarge(f"a string list holds at most {MAX_LIST_ITEMS} items, got {len(value)}")
        return list(value)
    return value


def encode(message: Message, *, level: int = 1) -> bytes:
    """The packet bytes of `message`; `level` is the zstd level (1 is fast and near the best size)."""
    cls = type(message)
    if cls not in WIRE_FIELDS:
        raise Malformed(f"encode() takes a codec message (Hello, Task, ...), got {cls.__name__}")
    body: dict[str, Any] = {"v": PROTOCOL_VERSION, "k": cls.kind_code, "run": message.run_id,
                            "r": message.round, "s": message.sender}
    for attr, key, kind in WIRE_FIELDS[cls]:
        body[key] = _encode_field(kind, getattr(message, attr))
    if isinstance(level, bool) or not isinstance(level, int) or not -7 <= level <= 22:
        raise ValueError(f"zstd level must be an int in [-7, 22], got {level!r}")
    writer = BodyWriter()
    writer.add(body)
    return writer.compress(MAGIC + bytes((PROTOCOL_VERSION, cls.kind_code, 0, 0)), level)


def _decode_meta(blob: bytes, limits: Limits, where: str) -> dict[str, Any]:
    if len(blob) > limits.max_meta_bytes:
        raise TooLarge(f"{where}: {len(blob)} bytes of meta, over Limits.max_meta_bytes = {limits.max_meta_bytes}")
    try:
        value = msgpack.unpackb(blob, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise Malformed(f"{where}: not a valid msgpack value ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, dict):
        raise Malformed(f"{where}: meta must be a map, got {type(value).__name__}")
    checked: dict[str, Any] = check_meta(value, where)
    return checked


def _decode_field(kind: str, body: dict[str, Any], key: str, limits: Limits, budget: Budget) -> Any:
    where = f"body.{key}"
    if kind == "str":
        return get_str(body, key, "body")
    if kind == "int":
        return get_int(body, key, "body", 0, MAX_I64)
    if kind == "strs":
        items = get_list(body, key, "body")
        if len(items) > MAX_LIST_ITEMS or not all(isinstance(item, str) for item in items):
            raise Malformed(f"{where}: expected an array of at most {MAX_LIST_ITEMS} strings")
        return tuple(items)
    if kind == "meta":
        return _decode_meta(get_bytes(body, key, "body"), limits, where)
    groups = body[key]
    if not isinstance(groups, dict):
        raise Malformed(f"{where}: expected a map of group name to group")
    return {check_name(name, f"{where} group name"): decode_group(group, budget, limits, f"{where}[{name!r}]")
            for name, group in groups.items()}


def read_prefix(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> tuple[memoryview, type[MessageBase]]:
    """Check the packet size and 8-byte prefix; returns (the zstd frame, the message class)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise Malformed(f"a packet is bytes, got {type(data).__name__}")
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise Malformed("a packet must be a contiguous byte buffer") from None
    if view.nbytes > limits.max_packet_bytes:
        raise TooLarge(f"packet of {view.nbytes} bytes is over Limits.max_packet_bytes = {limits.max_packet_bytes}")
    if view.nbytes < PREFIX_BYTES or bytes(view[:4]) != MAGIC:
        raise Malformed("not a Fedge packet: it does not start with the magic bytes 'FEDG'")
    if view[4] != PROTOCOL_VERSION:
        raise UnsupportedVersion(f"packet uses format version {view[4]}; this codec speaks version "
                                 f"{PROTOCOL_VERSION} (upgrade the older side)", view[4])
    if view[5] not in KINDS:
        raise UnknownKind(f"unknown message kind code {view[5]} (known: {sorted(KINDS)})")
    if view[6] or view[7]:
        raise Malformed(f"prefix flags are {view[6]:02x}{view[7]:02x}; version {PROTOCOL_VERSION} defines none")
    return view[PREFIX_BYTES:], KINDS[view[5]]


def decode(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Message:
    """The message in `data`; raises a `CodecError` subclass for anything that is not a valid packet."""
    frame, cls = read_prefix(data, limits)
    raw = frames.decompress(frame, max_size=limits.max_decompressed_bytes, where="packet body", need_checksum=True)
    caps = max(limits.max_tensors, MAX_LIST_ITEMS)
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True, max_str_len=MAX_TEXT_BYTES,
                               max_bin_len=len(raw), max_array_len=caps, max_map_len=max(MAX_GROUPS, 16),
                               max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise Malformed(f"packet body is not one valid msgpack value ({type(exc).__name__}: {exc})") from None
    fields = WIRE_FIELDS[cls]
    body = exact_map(body, HEADER_KEYS + tuple(key for _, key, _ in fields), "body")
    if get_int(body, "v", "body", 0, 255) != PROTOCOL_VERSION or get_int(body, "k", "body", 0, 255) != cls.kind_code:
        raise Malformed("the body's version or kind disagrees with the packet prefix")
    budget = Budget(limits)
    kwargs = {attr: _decode_field(kind, body, key, limits, budget) for attr, key, kind in fields}
    try:
        message = cast(Message, cls(get_str(body, "run", "body"), get_int(body, "r", "body", 0, MAX_I64),
                                    get_str(body, "s", "body"), **kwargs))
    except CodecError:
        raise
    except (TypeError, ValueError) as exc:
        raise Malformed(f"body does not form a valid {cls.__name__}: {exc}") from None
    return message


def packet_info(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Sizes from the prefix and frame header, without decoding the body (for `inspect`)."""
    frame, cls = read_prefix(data, limits)
    body = frames.content_size(frame, where="packet body", need_checksum=True)
    return {"version": PROTOCOL_VERSION, "kind": cls.kind, "kind_code": cls.kind_code,
            "packet_bytes": len(frame) + PREFIX_BYTES, "body_bytes": body}
