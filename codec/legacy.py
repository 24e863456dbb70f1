"""What this codec still writes in an older wire format: one refusal, so an older peer learns why it is refused.

An agent of wire-format version 2 cannot read a version-3 packet. When one says hello, the coordinator answers with
a version-2 ErrorMessage (``protocol-mismatch``), which that agent logs in one line and meets by backing off; the
operator then upgrades it. Nothing here decodes an older packet: an older packet is refused with
``UnsupportedVersion``, whatever it holds.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import msgpack

from fedge.codec import frames
from fedge.codec.fields import _check_text

VERSION_2_ERROR_KIND = 7


def version2_error(run_id: str, sender: str, code: str, reason: str) -> bytes:
    """A version-2 ErrorMessage packet: prefix ``FEDG 02 07 00 00`` and one zstd frame (content size and checksum)
    of the msgpack map {v: 2, k: 7, run, r: 0, s, code, why}."""
    for value, what in ((run_id, "run_id"), (sender, "sender"), (code, "code"), (reason, "reason")):
        _check_text(value, what)
    body = msgpack.packb({"v": 2, "k": VERSION_2_ERROR_KIND, "run": run_id, "r": 0, "s": sender, "code": code,
                          "why": reason}, use_bin_type=True)
    return b"FEDG" + bytes((2, VERSION_2_ERROR_KIND, 0, 0)) + frames.compress(body, level=1, checksum=True)
