"""``assert_never``: the last case of an exhaustive ``match`` over a union of events or actions, so that mypy
reports a case a dispatcher forgot (``typing.assert_never`` is Python 3.11; agents run 3.10). Imports nothing."""

from __future__ import annotations

from typing import NoReturn


def assert_never(value: NoReturn) -> NoReturn:
    raise AssertionError(f"unhandled case: {value!r}")
