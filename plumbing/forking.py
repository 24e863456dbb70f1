"""Processes forked from one preloaded server (multiprocessing's ``forkserver``): the first start launches a server
that imports the named modules once (torch among them, by the callers' lists), and every later child is a fork of
it, running in milliseconds instead of importing torch again (about 3 s of CPU each on a small board), its
imported pages shared until written. Used for the local fleet's agents and the simulated fleet's worker pool.

A child runs a known function of a Fedge module, so it never imports its starter's main module: multiprocessing
would run it again in every child, and a user's script that starts a session at import (no ``if __name__ ==
"__main__"`` guard) would start one in each. A server started earlier kept the working directory, ``sys.path`` and
environment of its start: a child adopts its parent's of now (``ParentState``, taken when the child is started), as
a started command would have them.

A forked child's parent is the server, which outlives the starter while any child lives: a child that must stop
with its starter watches the starter's pid (``ParentWatch``), not its own parent's.

Where the platform has no ``forkserver``, ``spawn`` (a fresh interpreter per child), under the same rules. Holds no
Fedge logic, imports nothing of Fedge and never torch itself (the server does, by name).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import context as contexts
from typing import Any

import psutil

_PRELOAD: list[str] = []


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While a child is started: a ``__main__`` with no file and no spec, so that its preparation names none."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _ForkedProcess(contexts.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - multiprocessing's name
        with _main_module_hidden():
            return contexts.ForkServerProcess._Popen(process_obj)


class _SpawnedProcess(contexts.SpawnProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802
        with _main_module_hidden():
            return contexts.SpawnProcess._Popen(process_obj)


class _ForkedContext(contexts.ForkServerContext):
    Process = _ForkedProcess


class _SpawnedContext(contexts.SpawnContext):
    Process = _SpawnedProcess


def preloaded_context(*modules: str) -> contexts.ForkServerContext | contexts.SpawnContext:
    """The context to start children in, with ``modules`` among those the server imports (a server already
    running keeps its own list: its children import the rest on first use)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return _SpawnedContext()
    _PRELOAD.extend(name for name in modules if name not in _PRELOAD)
    context = _ForkedContext()
    context.set_forkserver_preload(list(_PRELOAD))
    return context


@dataclass(frozen=True)
class ParentState:
    """The starting process's working directory, ``sys.path`` and environment, for a forked child to adopt."""

    cwd: str
    path: tuple[str, ...]
    environ: tuple[tuple[str, str], ...]

    @classmethod
    def now(cls) -> ParentState:
        return cls(os.getcwd(), tuple(sys.path), tuple(os.environ.items()))

    def adopt(self) -> None:
        """In the child: the parent's directory, import path and environment, in place of the server's."""
        os.chdir(self.cwd)
        sys.path[:] = list(self.path)
        os.environ.clear()
        os.environ.update(dict(self.environ))


class ParentWatch:
    """Whether a process (the one that started this one) is gone: exited, a zombie, or its pid now another
    process's (its start time changed)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.started = self.start_time()  # None: gone already

    def start_time(self) -> float | None:
        try:
            process = psutil.Process(self.pid)
            return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
        except psutil.Error:
            return None

    def gone(self) -> bool:
        return self.started is None or self.start_time() != self.started
