"""A ``coordinator`` command run in this process by its ``main`` (its exit status, its printed lines), where the
process boundary is not what a test is about: ``main`` sets up its own logging (``setup_logging``: stderr and the
run's coordinator.log), so the handlers it left are closed afterwards and the test process's are put back
(``kept_logging``, also a fixture for a test that calls ``main`` itself)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest


@contextmanager
def kept_logging() -> Iterator[None]:
    """The root logger's handlers and level as they were before the block, whatever it set up."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


def coordinator_main(argv: Sequence[str]) -> int:
    """``coordinator ARGV`` run in this process: its exit status."""
    from fedge.runtime.cli import main

    with kept_logging():
        return main(list(argv))


@pytest.fixture
def logging_kept() -> Iterator[None]:
    """``kept_logging`` around a test (registered in conftest.py)."""
    with kept_logging():
        yield
