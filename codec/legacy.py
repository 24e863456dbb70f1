"""What this codec still writes in an older wire format: one refusal, so an older peer learns why it is refused.

An agent of an older wire-format version (2 or 3) cannot read a version-4 packet. When one says hello, the
coordinator answers with an ErrorMessage (``protocol-mismatch``) in that agent's own version, which it logs in one
line and meets by backing off; the operator then upgrades it. Version 3's ErrorMessage has the layout of version
4's (only the version byte and the header's ``v`` differ); version 2's is its own (``version2_error``). Nothing
here decodes an older packet: an older packet is refused with ``UnsupportedVersion``, whatever it holds.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

from collections.abc import Callable

import msgpack

from fedge.codec import frames
from fedge.codec.fields import _check_text
from fedge.codec.messages import ErrorMessage
from fedge.codec.packet import encode_header

VERSION_2_ERROR_KIND = 7


def version2_error(run_id: str, sender: str, code: str, reason: str) -> bytes:
    """A version-2 ErrorMessage packet: prefix ``FEDG 02 07 00 00`` and one zstd frame (content size and checksum)
    of the msgpack map {v: 2, k: 7, run, r: 0, s, code, why}."""
    for value, what in ((run_id, "run_id"), (sender, "sender"), (code, "code"), (reason, "reason")):
        _check_text(value, what)
    body = msgpack.packb({"v": 2, "k": VERSION_2_ERROR_KIND, "run": run_id, "r": 0, "s": sender, "code": code,
                          "why": reason}, use_bin_type=True)
    return b"FEDG" + bytes((2, VERSION_2_ERROR_KIND, 0, 0)) + frames.compress(body, level=1, checksum=True)


def version3_error(run_id: str, sender: str, code: str, reason: str) -> bytes:
    """A version-3 ErrorMessage packet (round 0): version 4's layout with the version byte and ``v`` 3."""
    return encode_header(ErrorMessage(run_id=run_id, round=0, sender=sender, code=code, reason=reason), version=3)


OLDER_ERRORS: dict[int, Callable[[str, str, str, str], bytes]] = {2: version2_error, 3: version3_error}


def older_error(version: int, run_id: str, sender: str, code: str, reason: str) -> bytes | None:
    """The refusal in wire-format ``version``, or None when this codec writes none in it."""
    write = OLDER_ERRORS.get(version)
    return None if write is None else write(run_id, sender, code, reason)
