"""Handing a process's free heap pages back to the system. Imports nothing of Fedge, never torch or zmq."""

from __future__ import annotations

import ctypes


def trim_heap() -> None:
    """Hand the heap's free pages back to the system after a round (glibc's malloc_trim), so that an idle agent does
    not keep a round's temporary buffers resident: 25-55 MB less between rounds on the paper CNN (measured;
    docs/deployment.md, "Agent memory"). A no-op where the C library has no malloc_trim."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass
