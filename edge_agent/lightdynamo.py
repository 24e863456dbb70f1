"""A light stand-in for ``torch._dynamo`` in the agent process, which never compiles: about 60-70 MB less resident.

``torch.optim``'s optimizers and ``torch.utils.flop_counter`` import ``torch._dynamo`` (and with it sympy and about
800 more modules) only to call two functions that do nothing in eager mode: ``graph_break()`` inside every
``step``, and ``disable(fn)``, which wraps a method so that a compiler would not trace it. This module puts an object
in ``sys.modules["torch._dynamo"]`` that answers those two with what eager mode does (nothing, and the function
itself) and loads the real module the moment anything else of it is asked for, so the worst case is today's
memory. Measured: identical model bits after training and identical FLOP counts with and without it
(tests/test_lightdynamo.py); the agent's peak RSS on the paper CNN 351-375 MB with it, 418-435 MB without
(docs/deployment.md, "Agent memory").

Installed by ``edge-agent run`` after torch is imported and before anything imports ``torch._dynamo``;
``FEDGE_REAL_DYNAMO=1`` turns it off. Must never be installed in a process that compiles or exports with
``torch.onnx.export(dynamo=True)`` (the coordinator, ``edge-agent predict``). Imports only torch.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Callable
from typing import Any

NAME = "torch._dynamo"


class LightDynamo(types.ModuleType):
    """``graph_break`` and ``disable`` as eager mode has them; any other attribute loads the real module."""

    def graph_break(self) -> None:
        return None

    def disable(self, fn: Callable[..., Any] | None = None, recursive: bool = True,
                **_: Any) -> Callable[..., Any]:
        if fn is None:
            return lambda function: function
        return fn

    def __getattr__(self, name: str) -> Any:
        return getattr(real_dynamo(), name)


def real_dynamo() -> types.ModuleType:
    """Replace the stand-in with the real ``torch._dynamo`` (importing it) and return it."""
    import torch

    if isinstance(sys.modules.get(NAME), LightDynamo):
        del sys.modules[NAME]
        if isinstance(torch.__dict__.get("_dynamo"), LightDynamo):
            del torch.__dict__["_dynamo"]
    return importlib.import_module(NAME)


def install() -> bool:
    """Put the stand-in in place unless the real module is loaded already or FEDGE_REAL_DYNAMO=1; True if put."""
    import torch

    if os.environ.get("FEDGE_REAL_DYNAMO") == "1" or NAME in sys.modules:
        return False
    light = LightDynamo(NAME, __doc__)
    sys.modules[NAME] = light
    torch.__dict__["_dynamo"] = light
    return True
