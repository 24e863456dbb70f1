"""The two ways tests start a session: ``sessions`` plays them in this process (the default), ``procs`` starts
real coordinator and agent processes where the process boundary is the subject; both kill, by PID, whatever they
started. And every test process computes on one thread, as every Fedge process does (``plumbing/threads.py``):
pytest-xdist already runs one worker per core, and tiny models run slower on several threads, far slower on busy
cores. The longest modules are collected first (``tests/module_seconds.json``, written by
``scripts/module_seconds.py``), so that pytest-xdist's workers, given whole modules in collection order, end
together."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import procs
from tests.inprocess_cli import logging_kept
from tests.simfleet import sessions

__all__ = ["logging_kept", "one_thread", "procs", "sessions"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules longest first (a module not in the file last), each module's tests in their own order."""
    table = Path(__file__).with_name("module_seconds.json")
    seconds = json.loads(table.read_text()) if table.exists() else {}
    items.sort(key=lambda item: -seconds.get(item.module.__name__.rpartition(".")[2] if item.module else "", 0.0))


@pytest.fixture(scope="session", autouse=True)
def one_thread() -> Iterator[None]:
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1, user_api="blas"):
        yield
    torch.set_num_threads(threads)
