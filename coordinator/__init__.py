"""Fedge's coordinator: CLI, configuration, THE round loop, the ZeroMQ ROUTER transport, checkpoints, local fleet."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fedge")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without an install
    __version__ = "0.0.0+source"
