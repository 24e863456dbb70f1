"""Fedge's wire codec: typed messages, the protocol's vocabulary, sparse tensor coding, packets, limits and errors.

`encode(message) -> bytes` and `decode(bytes, Limits()) -> message` are the whole I/O-free interface
(`encode_body` and `read_header` split a packet where a caller needs it); docs/wire-format.md is the normative
byte-level description. This package uses only the standard library, numpy, msgpack and zstandard: it must never
import torch, zmq or any other Fedge package.
"""

from fedge.codec import vocabulary
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
from fedge.codec.legacy import older_error, version2_error, version3_error
from fedge.codec.masks import mask_crc, retained_count, topk_mask
from fedge.codec.messages import (
    PROTOCOL_VERSION,
    SPOKEN_VERSIONS,
    Bye,
    Cancel,
    Commit,
    ErrorMessage,
    Grant,
    Heartbeat,
    Hello,
    Message,
    SecAggDelivery,
    SecAggKeys,
    SecAggReveal,
    SecAggRoster,
    SecAggShares,
    SecAggUnmask,
    Task,
    Update,
    Welcome,
)
from fedge.codec.packet import Header, decode, encode, encode_body, encode_header, packet_kind, read_header
from fedge.codec.sparse import SparseSection
from fedge.codec.tensors import TensorGroup, received

__all__ = [
    "PROTOCOL_VERSION", "SPOKEN_VERSIONS", "vocabulary",
    "Hello", "Welcome", "Task", "Update", "Commit", "Heartbeat", "ErrorMessage", "Bye", "Cancel", "Grant",
    "SecAggKeys", "SecAggRoster", "SecAggShares", "SecAggDelivery", "SecAggUnmask", "SecAggReveal",
    "Message", "TensorGroup", "received", "SparseSection", "encode", "encode_body", "encode_header", "decode", "read_header", "packet_kind", "Header", "Limits",
    "older_error", "version2_error", "version3_error",
    "CodecError", "TooLarge", "Malformed", "UnsupportedVersion", "UnknownKind", "ChecksumError", "NonFinite",
    "ShapeMismatch", "MaskMismatch", "OutOfRange",
    "retained_count", "topk_mask", "mask_crc",
]
