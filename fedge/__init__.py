"""Fedge: a federated-learning runtime for edge devices.

Every part of Fedge lives under this one import name, so that Fedge can be imported beside a user's own
``models/`` or ``codec/``: each ``fedge.X`` is the repository's top-level folder ``X/``, mapped here by setuptools
(pyproject.toml, ``[tool.setuptools.package-dir]``). The packages, what each holds and their layer order:
docs/architecture.md.

This module must stay light: importing ``fedge`` loads no subpackage, and never torch or zmq
(tests/test_imports.py checks it). It holds only the installed version; ``fedge.exhaustive`` beside it holds
the ``assert_never`` of the exhaustive dispatchers.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fedge")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
