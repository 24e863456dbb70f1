"""How many threads numpy's BLAS library (OpenBLAS, MKL) runs in a Fedge process: one, unless the operator says
otherwise; and the few threads the coordinator folds the parts of a large exact sum on (``part_threads``). Imports
nothing of Fedge, never torch or zmq.

Fedge's numpy work is vector norms, dot products and sums over one update at a time, which a second BLAS thread
hardly speeds up; but OpenBLAS's worker threads spin while they wait for the next call, and with a call per update
they never stop: measured on the 2-core development machine, the coordinator serving 1,000 agents spent 30 s of
CPU a round in them (65 s in all, 35 s with one thread), and the round took 52 s instead of 42 s because the agents
on the same cores lost that time (docs/scale.md). ``FEDGE_BLAS_THREADS=N`` sets another count; 0 leaves the
library's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

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


class PartThreads:
    """Runs parts (callables) on this process's threads, the first on the caller's: returns once every part has
    finished, and raises the first error. The pool is made on first use, and again in a forked child."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.pool: tuple[int, ThreadPoolExecutor] | None = None

    def __call__(self, parts: Sequence[Callable[[], None]]) -> None:
        if len(parts) < 2:
            for part in parts:
                part()
            return
        if self.pool is None or self.pool[0] != os.getpid():
            self.pool = (os.getpid(), ThreadPoolExecutor(max(self.count - 1, 1), thread_name_prefix="exact-sum"))
        pending = [self.pool[1].submit(part) for part in parts[1:]]
        try:
            parts[0]()
        finally:  # no part is left running when this returns or raises
            wait(pending)
        for future in pending:
            future.result()


_part_threads: PartThreads | None = None


def part_threads() -> tuple[int, PartThreads]:
    """The process's part threads and how many parts to cut (the CPUs, at most 4), made once."""
    global _part_threads
    if _part_threads is None:
        _part_threads = PartThreads(max(1, min(4, os.cpu_count() or 1)))
    return _part_threads.count, _part_threads
