"""Where a simulated fleet's tasks are trained: in the coordinator's process, a pool of processes, or Ray actors.

A backend takes ``Job``s and gives back ``Outcome``s (``simulation.worker``), in whatever order they finish; the
fleet sorts nothing and needs nothing sorted, because the coordinator aggregates by client index. ``inline`` trains
one job per poll in the calling process (tests, a quick look); ``local`` keeps ``workers`` processes (forked from a
server that imported the worker and torch once: ``plumbing.forking``; one torch thread each); ``ray`` keeps ``workers`` Ray actors of one CPU each (``simulation.ray_backend``, imported only
when chosen, so that nothing else needs Ray). A worker process that dies fails the jobs it held, with the reason;
the pool is started again. Knows no algorithm, no model and no coordinator.
"""

from __future__ import annotations

import collections
import concurrent.futures as futures
import logging
import os
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

from fedge.plumbing.forking import ParentState, preloaded_context
from fedge.protocol.events import Outcome
from fedge.simulation.worker import Job, failed, forked_worker_setup, train_client

log = logging.getLogger("fedge.simulation")


class Backend(Protocol):
    """A pool that trains jobs."""

    workers: int

    def submit(self, job: Job) -> None: ...

    def results(self, timeout_s: float) -> list[Outcome]:
        """What finished, waiting up to ``timeout_s`` for the first when nothing has."""

    def close(self) -> None: ...


class InlineBackend:
    """Trains in the calling process, one job per call of ``results`` (so the session's loop keeps turning)."""

    workers = 1

    def __init__(self) -> None:
        self.queue: collections.deque[Job] = collections.deque()

    def submit(self, job: Job) -> None:
        self.queue.append(job)

    def results(self, timeout_s: float) -> list[Outcome]:
        if not self.queue:
            time.sleep(timeout_s)
            return []
        return [train_client(self.queue.popleft())]

    def close(self) -> None:
        self.queue.clear()


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


class LocalBackend:
    """A pool of worker processes on this machine, forked from a preloaded server (``plumbing.forking``)."""

    def __init__(self, workers: int = 0) -> None:
        self.workers = workers or default_workers()
        self.pool = self.start()
        self.running: dict[futures.Future[Outcome], Job] = {}

    def start(self) -> futures.ProcessPoolExecutor:
        return futures.ProcessPoolExecutor(self.workers, mp_context=preloaded_context("fedge.simulation.worker"),
                                           initializer=forked_worker_setup, initargs=(ParentState.now(),))

    def submit(self, job: Job) -> None:
        try:
            self.running[self.pool.submit(train_client, job)] = job
        except BrokenProcessPool:
            self.restart()
            self.running[self.pool.submit(train_client, job)] = job

    def restart(self) -> None:
        log.error("a simulated fleet's worker process died; starting the pool again")
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = self.start()

    def results(self, timeout_s: float) -> list[Outcome]:
        if not self.running:
            time.sleep(timeout_s)
            return []
        done, _ = futures.wait(list(self.running), timeout=timeout_s, return_when=futures.FIRST_COMPLETED)
        outcomes, broken = [], False
        for future in done:
            job = self.running.pop(future)
            try:
                outcomes.append(future.result())
            except BrokenProcessPool:
                broken = True
                outcomes.append(failed(job, "its worker process died"))
            except Exception as exc:  # the job could not even be carried to a worker (unpicklable, ...)
                outcomes.append(failed(job, f"{type(exc).__name__}: {exc}"))
        if broken:
            for future, job in list(self.running.items()):
                self.running.pop(future)
                outcomes.append(failed(job, "its worker process died"))
            self.restart()
        return outcomes

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.running.clear()


def make_backend(name: str, workers: int = 0, ray_address: str = "") -> Backend:
    """The backend ``fleet.backend`` names."""
    if name == "inline":
        return InlineBackend()
    if name == "local":
        return LocalBackend(workers)
    if name == "ray":
        from fedge.simulation.ray_backend import RayBackend

        return RayBackend(workers, ray_address)
    raise ValueError(f"unknown simulated-fleet backend {name!r}: inline, local or ray")
