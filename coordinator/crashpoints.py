"""The test seam that ends a coordinator at a named point of a round: ``FEDGE_CRASH_AT="POINT:ROUND"`` makes
``crash_point`` exit the process at once (status 70, no cleanup) at that point of that round, so that tests can check
that a crash anywhere resumes to the uninterrupted run (docs/run-dir.md). Nothing else; no I/O beyond the exit.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("fedge.coordinator")

CRASH_AT = os.environ.get("FEDGE_CRASH_AT", "")


def crash_point(point: str, round_number: int) -> None:
    if CRASH_AT and CRASH_AT == f"{point}:{round_number}":
        log.warning("FEDGE_CRASH_AT=%s: exiting now", CRASH_AT)
        os._exit(70)
