"""Packets: `encode` turns a message into bytes, `decode` turns bytes back into a message.

A packet is a 12-byte prefix (magic "FEDG", version, kind, flags, the header's length), the header (one msgpack
map: who, which round, and the message's typed fields; a long one, such as an Update's meter record, in its own
zstd frame, flagged), a CRC-32 of everything before it, and,
for a Task or an Update, the body: exactly one zstd frame (content size declared, content checksum on) around
one msgpack map of the tensor groups and the algorithm's meta; for a secure-aggregation message, a body frame of
the same kind around the map of its fields (keys and sealed shares are bytes, which the header may not hold). The body can be encoded on its own
(`encode_body`) and joined to a header later, so an Update's tensors are encoded once and its header can still
carry the meter's record of that encoding. `decode` checks every size against `Limits` before allocating it, and
raises only `CodecError` subclasses, whatever the input bytes; `read_header` reads the header alone.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import msgpack

from fedge.codec import frames
from fedge.codec.errors import (
    ChecksumError,
    CodecError,
    Limits,
    Malformed,
    TooLarge,
    UnknownKind,
    UnsupportedVersion,
)
from fedge.codec.fields import MAX_BODY_ITEMS, MAX_SEALED_BYTES, plain_data
from fedge.codec.messages import (
    BODY_FIELDS,
    HEADER_FIELDS,
    KINDS,
    MAX_LIST_ITEMS,
    MAX_TEXT_BYTES,
    PROTOCOL_VERSION,
    Message,
    MessageBase,
    Task,
    Update,
)
from fedge.codec.schema import MAX_I64, Budget, check_name, exact_map, get_bytes, get_int, get_str
from fedge.codec.stream import BodyWriter
from fedge.codec.tensors import TensorGroup, decode_group, encode_group

MAGIC = b"FEDG"
PREFIX_BYTES = 12  # magic, version, kind, flags, header length
CRC_BYTES = 4
MAX_GROUPS = 256
MAX_HEADER_MAP = 1024
HEADER_ZSTD = 0x01           # flags bit: the header is one zstd frame of the msgpack map
COMPRESS_HEADER_FROM = 512   # the encoder compresses headers this long or longer (meter records), when it pays
COMMON_KEYS = ("v", "k", "run", "r", "s")
DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Header:
    """What `read_header` found: the message class, the common fields, the decoded header map, and where the body
    starts."""

    cls: type[MessageBase]
    run_id: str
    round: int
    sender: str
    fields: dict[str, Any]
    body_at: int


def encode_body(groups: Mapping[str, TensorGroup], meta: Mapping[str, Any], *, level: int = 1) -> bytes:
    """The body frame of a Task or an Update with these groups and meta (to pass to `encode` as `body=`)."""
    if len(groups) > MAX_GROUPS:
        raise TooLarge(f"a message carries at most {MAX_GROUPS} tensor groups, got {len(groups)}")
    if isinstance(level, bool) or not isinstance(level, int) or not -7 <= level <= 22:
        raise ValueError(f"zstd level must be an int in [-7, 22], got {level!r}")
    for name, group in groups.items():
        check_name(name, "group name")
        if not isinstance(group, TensorGroup):
            raise Malformed(f"group {name!r} must be a TensorGroup, got {type(group).__name__}")
    writer = BodyWriter()
    writer.add({"g": {name: encode_group(group) for name, group in groups.items()},
                "m": msgpack.packb(plain_data(meta), use_bin_type=True)})
    return writer.compress(b"", level)


def unpack_header(packed: bytes | memoryview, where: str = "the header") -> Any:
    """The header's msgpack value, within the header's limits (strings, arrays and maps); Malformed otherwise."""
    try:
        return msgpack.unpackb(packed, raw=False, strict_map_key=True, use_list=True, max_str_len=MAX_TEXT_BYTES,
                               max_bin_len=0, max_array_len=MAX_LIST_ITEMS, max_map_len=MAX_HEADER_MAP,
                               max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise Malformed(f"{where} is not one valid msgpack value within the header's limits (strings of at most "
                        f"{MAX_TEXT_BYTES} bytes, arrays of {MAX_LIST_ITEMS} items, maps of {MAX_HEADER_MAP} "
                        f"entries; {type(exc).__name__}: {exc})") from None


def encode_header(message: Message, version: int = PROTOCOL_VERSION) -> bytes:
    """The prefix, header and CRC of `message`: a whole packet for kinds without a body. `version`: the format
    version byte and header `v` (another only for ``legacy``'s refusal in a layout an older side shares)."""
    cls = type(message)
    if cls not in HEADER_FIELDS:
        raise Malformed(f"encode() takes a codec message (Hello, Task, ...), got {cls.__name__}")
    header: dict[str, Any] = {"v": version, "k": cls.kind_code, "run": message.run_id,
                              "r": message.round, "s": message.sender}
    for attr, key, _kind in HEADER_FIELDS[cls]:
        header[key] = getattr(message, attr)
    packed: bytes = msgpack.packb(header, use_bin_type=True)
    unpack_header(packed, f"the {cls.__name__}'s header")  # refuse here what every decoder would refuse
    if len(packed) > DEFAULT_LIMITS.max_header_bytes:
        raise TooLarge(f"the header is {len(packed)} bytes, over Limits.max_header_bytes = "
                       f"{DEFAULT_LIMITS.max_header_bytes}")
    flags = 0
    if len(packed) >= COMPRESS_HEADER_FROM:
        squeezed = frames.compress(packed, level=1, checksum=True)
        if len(squeezed) < len(packed):
            packed, flags = squeezed, HEADER_ZSTD
    head = MAGIC + bytes((version, cls.kind_code, flags, 0)) + struct.pack("<I", len(packed)) + packed
    return head + struct.pack("<I", zlib.crc32(head))


def encode_fields_body(message: Message, level: int = 1) -> bytes:
    """The body frame of a secure-aggregation message: the map of its body fields (``BODY_FIELDS``)."""
    fields = {key: [list(item) if isinstance(item, tuple) else item for item in value]
              if isinstance(value, tuple) else value
              for attr, key, _ in BODY_FIELDS[type(message)] for value in (getattr(message, attr),)}
    return frames.compress(msgpack.packb(fields, use_bin_type=True), level=level, checksum=True)


def encode(message: Message, *, level: int = 1, body: bytes | None = None) -> bytes:
    """The packet bytes of `message`; `level` is the zstd level of the body (1 is fast and near the best size).
    `body`: the body frame already encoded by `encode_body` from this message's groups and meta."""
    head = encode_header(message)
    if not isinstance(message, (Task, Update)):
        if body is not None:
            raise Malformed(f"a {type(message).__name__} has no body of tensor groups to pass in")
        return head + encode_fields_body(message, level) if type(message) in BODY_FIELDS else head
    if body is None:
        body = encode_body(message.groups, message.meta, level=level)
    return head + body


def packet_kind(data: bytes | bytearray | memoryview) -> type[MessageBase] | None:
    """The message class a packet's prefix names (magic, this version, a known kind), or None; nothing else is
    checked. For a receiver that must answer a packet it cannot decode (a welcome it has to decline)."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 6 or bytes(data[:4]) != MAGIC or \
            data[4] != PROTOCOL_VERSION:
        return None
    return KINDS.get(data[5])


def read_header(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Header:
    """The packet's prefix and header, checked (sizes, magic, version, kind, flags, CRC, the header's keys)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise Malformed(f"a packet is bytes, got {type(data).__name__}")
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise Malformed("a packet must be a contiguous byte buffer") from None
    if view.nbytes > limits.max_packet_bytes:
        raise TooLarge(f"packet of {view.nbytes} bytes is over Limits.max_packet_bytes = {limits.max_packet_bytes}")
    if view.nbytes < 6 or bytes(view[:4]) != MAGIC:
        raise Malformed("not a Fedge packet: it does not start with the magic bytes 'FEDG'")
    if view[4] != PROTOCOL_VERSION:
        raise UnsupportedVersion(f"packet uses wire-format version {view[4]}; this side speaks version "
                                 f"{PROTOCOL_VERSION} (upgrade the older side: coordinator first, then agents)",
                                 view[4])
    if view[5] not in KINDS:
        raise UnknownKind(f"unknown message kind code {view[5]} (known: {sorted(KINDS)})")
    if view.nbytes < PREFIX_BYTES + CRC_BYTES:
        raise Malformed(f"a packet is at least {PREFIX_BYTES + CRC_BYTES} bytes, got {view.nbytes}")
    if view[6] & ~HEADER_ZSTD or view[7]:
        raise Malformed(f"prefix flags are {view[6]:02x}{view[7]:02x}; version {PROTOCOL_VERSION} defines only "
                        f"bit 0 of the first byte (a compressed header)")
    size = struct.unpack_from("<I", view, 8)[0]
    if size > limits.max_header_bytes:
        raise TooLarge(f"header of {size} bytes is over Limits.max_header_bytes = {limits.max_header_bytes}")
    end = PREFIX_BYTES + size
    if end + CRC_BYTES > view.nbytes:
        raise Malformed(f"the packet ends inside its header ({view.nbytes} bytes, the header needs {end + 4})")
    if zlib.crc32(view[:end]) != struct.unpack_from("<I", view, end)[0]:
        raise ChecksumError("the header's CRC-32 does not match: the packet was damaged")
    packed: memoryview | bytes = view[PREFIX_BYTES:end]
    if view[6] & HEADER_ZSTD:
        packed = frames.decompress(packed, max_size=limits.max_header_bytes, where="header", need_checksum=True,
                                   limit="Limits.max_header_bytes")
    header = unpack_header(packed)
    cls = KINDS[view[5]]
    header = exact_map(header, COMMON_KEYS + tuple(key for _, key, _ in HEADER_FIELDS[cls]), "header")
    if get_int(header, "v", "header", 0, 255) != PROTOCOL_VERSION or get_int(header, "k", "header", 0, 255) != cls.kind_code:
        raise Malformed("the header's version or kind disagrees with the packet prefix")
    fields = {attr: header[key] for attr, key, _ in HEADER_FIELDS[cls]}
    return Header(cls, get_str(header, "run", "header"), get_int(header, "r", "header", 0, MAX_I64),
                  get_str(header, "s", "header"), fields, end + CRC_BYTES)


def _decode_meta(blob: bytes, limits: Limits) -> dict[str, Any]:
    if len(blob) > limits.max_meta_bytes:
        raise TooLarge(f"body.m: {len(blob)} bytes of meta, over Limits.max_meta_bytes = {limits.max_meta_bytes}")
    try:
        value = msgpack.unpackb(blob, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise Malformed(f"body.m: not a valid msgpack value ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, dict):
        raise Malformed(f"body.m: meta must be a map, got {type(value).__name__}")
    checked: dict[str, Any] = plain_data(value, "body.m")
    return checked


def decode_body(frame: memoryview, limits: Limits = DEFAULT_LIMITS) -> tuple[dict[str, TensorGroup], dict[str, Any]]:
    """The groups and meta of a body frame."""
    if not frame.nbytes:
        raise Malformed("a Task or an Update needs its body frame after the header")
    raw = frames.decompress(frame, max_size=limits.max_decompressed_bytes, where="packet body", need_checksum=True)
    caps = max(limits.max_tensors, MAX_LIST_ITEMS)
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True, max_str_len=MAX_TEXT_BYTES,
                               max_bin_len=len(raw), max_array_len=caps, max_map_len=max(MAX_GROUPS, 16),
                               max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise Malformed(f"packet body is not one valid msgpack value ({type(exc).__name__}: {exc})") from None
    body = exact_map(body, ("g", "m"), "body")
    groups = body["g"]
    if not isinstance(groups, dict):
        raise Malformed("body.g: expected a map of group name to group")
    budget = Budget(limits)
    decoded = {check_name(name, "body.g group name"): decode_group(group, budget, limits, f"body.g[{name!r}]")
               for name, group in groups.items()}
    return decoded, _decode_meta(get_bytes(body, "m", "body"), limits)


def decode_fields_body(frame: memoryview, cls: type[MessageBase], limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The body fields of a secure-aggregation message (checked by its class when it is built)."""
    if not frame.nbytes:
        raise Malformed(f"a {cls.__name__} needs its body frame after the header")
    raw = frames.decompress(frame, max_size=limits.max_decompressed_bytes, where="packet body", need_checksum=True)
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True, max_str_len=MAX_TEXT_BYTES,
                               max_bin_len=MAX_SEALED_BYTES, max_array_len=MAX_BODY_ITEMS, max_map_len=16,
                               max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise Malformed(f"packet body is not one valid msgpack value within its limits ({type(exc).__name__}: "
                        f"{exc})") from None
    table = BODY_FIELDS[cls]
    body = exact_map(body, tuple(key for _, key, _ in table), "body")
    return {attr: body[key] for attr, key, _ in table}


def decode(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Message:
    """The message in `data`; raises a `CodecError` subclass for anything that is not a valid packet."""
    header = read_header(data, limits)
    rest = memoryview(data).cast("B")[header.body_at:]
    kwargs = dict(header.fields)
    if header.cls in (Task, Update):
        kwargs["groups"], kwargs["meta"] = decode_body(rest, limits)
    elif header.cls in BODY_FIELDS:
        kwargs.update(decode_fields_body(rest, header.cls, limits))
    elif rest.nbytes:
        raise Malformed(f"a {header.cls.__name__} has no body, but {rest.nbytes} bytes follow its header")
    try:
        message = cast(Message, header.cls(header.run_id, header.round, header.sender, **kwargs))
    except CodecError:
        raise
    except (TypeError, ValueError) as exc:
        raise Malformed(f"the packet does not form a valid {header.cls.__name__}: {exc}") from None
    return message


def packet_info(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Sizes from the prefix, header and frame header, without decoding the body (for `inspect`)."""
    header = read_header(data, limits)
    size = memoryview(data).nbytes
    info = {"version": PROTOCOL_VERSION, "kind": header.cls.kind, "kind_code": header.cls.kind_code,
            "packet_bytes": size, "header_bytes": header.body_at - PREFIX_BYTES - CRC_BYTES,
            "body_bytes": 0, "body_content_bytes": 0}
    if header.cls in BODY_FIELDS:
        frame = memoryview(data).cast("B")[header.body_at:]
        info["body_bytes"] = frame.nbytes
        info["body_content_bytes"] = frames.content_size(frame, where="packet body", need_checksum=True)
    return info
