"""The codec's error types and the decode limits.

Every rejection the codec makes, while encoding or decoding, raises a subclass of `CodecError`
whose message says what was wrong and what to do about it. A caller that catches `CodecError`
catches every way a packet can be bad; nothing else escapes `decode`.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


class CodecError(Exception):
    """Base class of every error the codec raises for a bad packet or a bad message."""


class TooLarge(CodecError):
    """A size (packet, decompressed body, tensor count, element count, meta) is over its limit."""


class Malformed(CodecError):
    """The bytes are not a valid packet, or a message to encode breaks the format's rules."""


class UnsupportedVersion(CodecError):
    """The packet's format version is not one this codec speaks."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class UnknownKind(CodecError):
    """The packet's message kind code is not defined by this format version."""


class ChecksumError(CodecError):
    """A checksum over the content (the zstd content checksum or a mask CRC) does not match."""


class NonFinite(CodecError):
    """A float value is NaN or infinite where the policy forbids it."""


class ShapeMismatch(CodecError):
    """Shapes, lengths or value counts disagree with each other."""


class MaskMismatch(CodecError):
    """A values-only section was applied to a mask other than the one it was encoded against."""


class OutOfRange(CodecError):
    """A value cannot be represented in the chosen lossy encoding (e.g. above float16's maximum)."""


@dataclass(frozen=True)
class Limits:
    """Upper bounds a receiver enforces before it allocates anything for a packet.

    Every count is checked from the packet's headers and tables, before the memory it implies is
    allocated. `allow_nonfinite=False` rejects NaN and infinities in float tensor values.
    """

    max_packet_bytes: int = 64 * MiB
    max_decompressed_bytes: int = 256 * MiB
    max_tensors: int = 4096
    max_elements: int = 64 * MiB
    max_meta_bytes: int = 1 * MiB
    max_header_bytes: int = 1 * MiB
    allow_nonfinite: bool = False

    def __post_init__(self) -> None:
        for name in ("max_packet_bytes", "max_decompressed_bytes", "max_tensors", "max_elements",
                     "max_meta_bytes", "max_header_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Limits.{name} must be a non-negative int, got {value!r}")
