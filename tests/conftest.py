"""The two ways tests start a session: ``sessions`` plays them in this process (the default), ``procs`` starts
real coordinator and agent processes where the process boundary is the subject; both kill, by PID, whatever they
started. And every test process computes on one thread, as every Fedge process does (``plumbing/threads.py``):
pytest-xdist already runs one worker per core, and tiny models run slower on several threads, far slower on busy
cores."""

from collections.abc import Iterator

import pytest

from tests.e2e import procs
from tests.inprocess_cli import logging_kept
from tests.simfleet import sessions

__all__ = ["logging_kept", "one_thread", "procs", "sessions"]


@pytest.fixture(scope="session", autouse=True)
def one_thread() -> Iterator[None]:
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1, user_api="blas"):
        yield
    torch.set_num_threads(threads)
