"""zstd frames: reused per-thread (de)compressors and a decompress that checks sizes first.

The size a frame will inflate to is read from its header and checked against the caller's
limit before any output buffer is allocated; frames without a declared content size, with
trailing bytes, or (where required) without a content checksum are rejected.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import threading

import zstandard

from fedge.codec.errors import ChecksumError, Malformed, TooLarge

_local = threading.local()
MAX_WINDOW_BYTES = 1 << 27


def compressor(level: int, checksum: bool) -> zstandard.ZstdCompressor:
    """This thread's compressor for (level, checksum), created on first use and then reused."""
    cache: dict[tuple[int, bool], zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = {}
        _local.compressors = cache
    key = (level, checksum)
    found = cache.get(key)
    if found is None:
        found = zstandard.ZstdCompressor(level=level, write_checksum=checksum, write_content_size=True,
                                         write_dict_id=False)
        cache[key] = found
    return found


def _decompressor() -> zstandard.ZstdDecompressor:
    found: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if found is None:
        found = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        _local.decompressor = found
    return found


def compress(data: bytes | bytearray | memoryview, *, level: int = 1, checksum: bool = True) -> bytes:
    """One zstd frame holding `data`, with its content size in the header."""
    if isinstance(level, bool) or not isinstance(level, int) or not -7 <= level <= 22:
        raise ValueError(f"zstd level must be an int in [-7, 22], got {level!r}")
    return compressor(level, checksum).compress(data)


def raw_frame(data: bytes) -> bytes:
    """A zstd frame that stores `data` uncompressed (raw blocks, no checksum), at memcpy speed.

    For content zstd cannot shrink (a bitmap near half density) this is what zstd would emit
    anyway, minus the time it spends trying.
    """
    size = len(data)
    if size < 256:
        header = bytes((0x20,)) + size.to_bytes(1, "little")
    elif size < 65536 + 256:
        header = bytes((0x60,)) + (size - 256).to_bytes(2, "little")
    elif size < 1 << 32:
        header = bytes((0xA0,)) + size.to_bytes(4, "little")
    else:
        header = bytes((0xE0,)) + size.to_bytes(8, "little")
    parts = [b"\x28\xb5\x2f\xfd", header]
    block = 1 << 17
    for start in range(0, max(size, 1), block):
        chunk = data[start:start + block]
        last = start + block >= size
        parts += [(int(last) | (len(chunk) << 3)).to_bytes(3, "little"), chunk]
    return b"".join(parts)


def content_size(frame: bytes | memoryview, *, where: str, need_checksum: bool) -> int:
    """The declared content size of the zstd frame at the start of `frame`."""
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise Malformed(f"{where}: not a valid zstd frame header ({exc})") from None
    if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
        raise Malformed(f"{where}: the zstd frame does not declare its content size")
    if params.dict_id != 0:
        raise Malformed(f"{where}: the zstd frame needs a dictionary, which this format never uses")
    if need_checksum and not params.has_checksum:
        raise Malformed(f"{where}: the zstd frame has no content checksum; encoders must enable it")
    return int(params.content_size)


def decompress(frame: bytes | memoryview, *, max_size: int, where: str, need_checksum: bool,
               exact_size: int | None = None, limit: str = "Limits.max_decompressed_bytes") -> bytes:
    """Inflate exactly one zstd frame, refusing it before allocation if it declares too much."""
    size = content_size(frame, where=where, need_checksum=need_checksum)
    if exact_size is not None and size != exact_size:
        raise Malformed(f"{where}: zstd frame declares {size} bytes of content, expected {exact_size}")
    if size > max_size:
        raise TooLarge(f"{where}: zstd frame declares {size} bytes of content, over the limit of "
                       f"{max_size} bytes (raise {limit} if it is legitimate)")
    try:
        out = _decompressor().decompress(frame, max_output_size=max(size, 1), allow_extra_data=False)
    except zstandard.ZstdError as exc:
        text = str(exc)
        if "checksum" in text.lower():
            raise ChecksumError(f"{where}: zstd content checksum mismatch; the packet was corrupted "
                                f"in transit") from None
        raise Malformed(f"{where}: zstd frame is truncated or corrupt ({text})") from None
    if len(out) != size:
        raise Malformed(f"{where}: zstd frame inflated to {len(out)} bytes, but declared {size}")
    return out
