"""How many threads numpy's BLAS library (OpenBLAS, MKL) runs in a Fedge process: one, unless the operator says
otherwise. Imports nothing of Fedge, never torch or zmq.

Fedge's numpy work is vector norms, dot products and sums over one update at a time, which a second BLAS thread
hardly speeds up; but OpenBLAS's worker threads spin while they wait for the next call, and with a call per update
they never stop: measured on the 2-core development machine, the coordinator serving 1,000 agents spent 30 s of
CPU a round in them (65 s in all, 35 s with one thread), and the round took 52 s instead of 42 s because the agents
on the same cores lost that time (docs/scale.md). ``FEDGE_BLAS_THREADS=N`` sets another count; 0 leaves the
library's own.
"""

from __future__ import annotations

import os

from threadpoolctl import threadpool_limits

BLAS_THREADS_VARIABLE = "FEDGE_BLAS_THREADS"


def one_blas_thread() -> int:
    """Limit this process's BLAS to ``FEDGE_BLAS_THREADS`` threads (1 when unset; 0: leave it); returns the
    limit set (0: none)."""
    raw = os.environ.get(BLAS_THREADS_VARIABLE, "1").strip()
    try:
        count = int(raw)
    except ValueError:
        raise ValueError(f"{BLAS_THREADS_VARIABLE}={raw!r}: expected a whole number (0: the library's own)") from None
    if count < 0:
        raise ValueError(f"{BLAS_THREADS_VARIABLE}={raw!r}: expected 0 or more")
    if count:
        threadpool_limits(limits=count, user_api="blas")
    return count
