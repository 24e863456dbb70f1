"""Fedge's wire codec: typed messages, sparse tensor coding, packets, limits and errors.

`encode(message) -> bytes` and `decode(bytes, Limits()) -> message` are the whole I/O-free
interface; docs/wire-format.md is the normative byte-level description. This package uses only
the standard library, numpy, msgpack and zstandard: it must never import torch, zmq or any
other Fedge package.
"""

from fedge.codec.errors import (
    ChecksumError,
    CodecError,
    Limits,
    Malformed,
    MaskMismatch,
    NonFinite,
    OutOfRange,
    ShapeMismatch,
    TooLarge,
    UnknownKind,
    UnsupportedVersion,
)
from fedge.codec.masks import mask_crc, retained_count, topk_mask
from fedge.codec.messages import (
    HELLO_HOLDS,
    JOIN_REFUSALS,
    PROTOCOL_VERSION,
    SESSION_FINISHED,
    Bye,
    Commit,
    ErrorMessage,
    Heartbeat,
    Hello,
    Message,
    Task,
    Update,
    Welcome,
)
from fedge.codec.packet import decode, encode
from fedge.codec.sparse import SparseSection
from fedge.codec.tensors import TensorGroup

__all__ = [
    "PROTOCOL_VERSION", "Hello", "Welcome", "Task", "Update", "Commit", "Heartbeat", "ErrorMessage", "Bye", "JOIN_REFUSALS", "HELLO_HOLDS", "SESSION_FINISHED",
    "Message", "TensorGroup", "SparseSection", "encode", "decode", "Limits",
    "CodecError", "TooLarge", "Malformed", "UnsupportedVersion", "UnknownKind", "ChecksumError", "NonFinite",
    "ShapeMismatch", "MaskMismatch", "OutOfRange",
    "retained_count", "topk_mask", "mask_crc",
]
