"""Fedge: a federated-learning runtime for edge devices.

Every part of Fedge lives under this one import name, so that Fedge can be imported beside a user's own
``models/`` or ``codec/``: ``fedge.codec`` (the wire format), ``fedge.models``, ``fedge.algorithms``,
``fedge.fldata`` (datasets and partitions), ``fedge.meter``, ``fedge.coordinator`` and ``fedge.edge_agent``.
In the repository those packages are the top-level folders of the same names (``codec/``, ``models/``, ...);
setuptools maps them here (pyproject.toml, ``[tool.setuptools.package-dir]``).

This module must stay light: importing ``fedge`` loads no subpackage, and never torch or zmq
(tests/test_namespace.py checks it). It holds only the installed version.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fedge")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
