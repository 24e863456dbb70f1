"""Resolving a plugin name to a callable: entry points, ``module:qualname`` paths and in-code registrations.

A plugin kind (``model``, ``loss``, ``data``, ``algorithm``) has an entry-point group (``fedge.models``,
``fedge.losses``, ``fedge.data``, ``fedge.algorithms``). A name is either a path ``package.module:qualname`` or the name of an entry point in that group, or
a name registered in code with ``register``. ``describe`` resolves a name to a ``PluginRef`` from package metadata
alone (no import); ``load`` imports it. ``allowed`` is the device's rule; the coordinator trusts its own
configuration. Must not import torch or any other Fedge package.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as metadata
import os
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

GROUPS = {"model": "fedge.models", "loss": "fedge.losses", "data": "fedge.data", "algorithm": "fedge.algorithms"}
# Kinds whose plugin is an object with attributes (an algorithm: Config, Server and Client), not a callable.
NAMESPACE_KINDS = frozenset({"algorithm"})


class PluginError(ValueError):
    """A plugin name cannot be resolved, is not allowed here, or its callable failed; the message says which."""


@dataclass(frozen=True)
class PluginRef:
    """A resolved plugin: the name as configured, the ``module:qualname`` it stands for, and the installed
    distribution (name and version) that provides the module ("" when it is not part of an installed one)."""

    kind: str
    name: str
    target: str
    distribution: str = ""
    version: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "target": self.target, "distribution": self.distribution,
                "version": self.version}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PluginRef:
        try:
            return cls(**{key: str(raw[key]) for key in ("kind", "name", "target", "distribution", "version")})
        except KeyError as exc:
            raise PluginError(f"a plugin description lacks {exc}") from None


# In-code registrations: (kind, name) -> import path, and the callable itself for this process.
_REGISTERED: dict[tuple[str, str], tuple[str, Callable[..., Any]]] = {}


def is_path(name: str) -> bool:
    """True for ``package.module:qualname``."""
    module, sep, qualname = name.partition(":")
    return bool(sep and module and qualname)


def _group(kind: str) -> str:
    if kind not in GROUPS:
        raise PluginError(f"unknown plugin kind {kind!r}; known: {', '.join(GROUPS)}")
    return GROUPS[kind]


def _entry_points(kind: str) -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=_group(kind)))


def _path_of(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or ""
    qualname = getattr(fn, "__qualname__", None) or ""
    return f"{module}:{qualname}"


def importable_path(fn: Callable[..., Any]) -> str | None:
    """The path another process can import ``fn`` by, or None for a lambda, a closure or a script's ``__main__``."""
    path = _path_of(fn)
    module, _, qualname = path.partition(":")
    if not module or module == "__main__" or "<" in qualname:
        return None
    return path


def register(kind: str, name: str, fn: Callable[..., Any]) -> str:
    """Make ``name`` resolve to ``fn`` in this process and record its import path (returned; "" when it has none:
    then only an in-process session can use it)."""
    _group(kind)
    if not callable(fn):
        raise PluginError(f"{kind} {name!r}: {fn!r} is not callable")
    if not name or is_path(name):
        raise PluginError(f"{kind} {name!r}: a registered name must be a plain name, not a module:callable path")
    path = importable_path(fn) or ""
    _REGISTERED[(kind, name)] = (path, fn)
    return path


def registered(kind: str) -> dict[str, str]:
    """The names registered in code for a kind, with their import paths."""
    return {name: path for (k, name), (path, _) in _REGISTERED.items() if k == kind}


def _path_stamp() -> tuple[tuple[str, int], ...]:
    """The import path and each entry's modification time: installing or removing a distribution changes it."""
    stamp = []
    for entry in sys.path:
        try:
            stamp.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            stamp.append((entry, -1))
    return tuple(stamp)


@functools.lru_cache(maxsize=4)
def _top_levels(_stamp: tuple[tuple[str, int], ...]) -> Mapping[str, list[str]]:
    """Top-level import name -> distributions, read once per import path: reading it walks every installed
    distribution's file list (about 0.6 s on a 2-core machine), and every plugin model's describe needs it."""
    return metadata.packages_distributions()


def _distribution_of(module: str) -> tuple[str, str]:
    top = module.split(".", 1)[0]
    names = _top_levels(_path_stamp()).get(top, [])
    if not names:
        return "", ""
    name = sorted(names)[0]
    try:
        return name, metadata.version(name)
    except metadata.PackageNotFoundError:
        return name, ""


def describe(kind: str, name: str, *, for_processes: bool = False) -> PluginRef:
    """Resolve ``name`` without importing it. ``for_processes``: the callable must also be importable by path in
    another process (a local fleet's agents, devices), so an in-code registration of a lambda is refused."""
    if not isinstance(name, str) or not name:
        raise PluginError(f"a {kind} plugin name must be a non-empty string, got {name!r}")
    if (kind, name) in _REGISTERED:
        path, fn = _REGISTERED[(kind, name)]
        if not path:
            if for_processes:
                raise PluginError(f"{kind} {name!r} was registered from {_path_of(fn)}, which another process "
                                  "cannot import (a lambda, a closure or the running script): define it at module "
                                  "level in an importable module")
            return PluginRef(kind, name, _path_of(fn))
        return PluginRef(kind, name, path, *_distribution_of(path.partition(":")[0]))
    if is_path(name):
        return PluginRef(kind, name, name, *_distribution_of(name.partition(":")[0]))
    for entry in _entry_points(kind):
        if entry.name == name:
            dist = entry.dist
            return PluginRef(kind, name, entry.value, dist.name if dist else "", dist.version if dist else "")
    installed = sorted(e.name for e in _entry_points(kind))
    raise PluginError(f"unknown {kind} {name!r}: not a built-in, not package.module:callable, and no installed "
                      f"entry point in {GROUPS[kind]} has that name"
                      + (f" (installed: {', '.join(installed)})" if installed else ""))


def allowed(kind: str, name: str, allow: Collection[str]) -> bool:
    """The device's rule, decided from metadata without importing: an entry point installed here (by name or by
    target) or a name listed in the device's own ``allow_plugins``."""
    if name in allow:
        return True
    return any(name in (entry.name, entry.value) for entry in _entry_points(kind))


def check_allowed(kind: str, name: str, allow: Collection[str]) -> None:
    """Raise PluginError naming ``name`` unless ``allowed``; nothing is imported either way."""
    if not allowed(kind, name, allow):
        raise PluginError(f"{kind} {name!r} is not installed as a {GROUPS[kind]} entry point on this device and not "
                          "in agent.allow_plugins: refusing to import what the network names")


def load(ref: PluginRef) -> Callable[..., Any]:
    """Import the callable a ref stands for; one-line PluginError when the module or attribute is missing."""
    registered_entry = _REGISTERED.get((ref.kind, ref.name))
    if registered_entry is not None:
        return registered_entry[1]
    module_name, _, qualname = ref.target.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raises at import
        raise PluginError(f"{ref.kind} {ref.name!r}: cannot import {module_name}: {type(exc).__name__}: {exc}") \
            from None
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise PluginError(f"{ref.kind} {ref.name!r}: module {module_name} has no {qualname}") from None
    if not callable(target) and ref.kind not in NAMESPACE_KINDS:
        raise PluginError(f"{ref.kind} {ref.name!r}: {ref.target} is not callable")
    return target  # type: ignore[no-any-return]


def version_mismatch(expected: PluginRef, here: PluginRef) -> str:
    """Why ``here`` (this device's resolution) differs from ``expected`` (the coordinator's), or ""."""
    if expected.target != here.target:
        return f"{expected.kind} {expected.name!r} is {here.target} here but {expected.target} on the coordinator"
    if (expected.distribution, expected.version) != (here.distribution, here.version):
        return (f"{expected.kind} {expected.name!r} comes from {here.distribution or 'no distribution'} "
                f"{here.version} here but {expected.distribution or 'no distribution'} {expected.version} on the "
                "coordinator (set agent.allow_plugin_mismatch = true to accept)")
    return ""
