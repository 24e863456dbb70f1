"""Plugins: user code named by a string (``package.module:callable`` or an entry-point name), resolved safely.

Holds ``PluginRef`` (what a name resolves to, and which installed distribution provides it), ``describe`` (that
resolution without importing anything), ``allowed`` (the agent's rule: nothing the network names is imported unless
it is an entry point installed here or listed in the device's own TOML), ``load`` (the import, with one-line
errors) and in-code registration (``register``), which records the callable's import path so that other processes
can import the same thing. Knows no other Fedge package and never imports torch: the callables are opaque here.
"""

from fedge.plugins.names import (
    GROUPS,
    PluginError,
    PluginRef,
    allowed,
    check_allowed,
    describe,
    is_path,
    load,
    register,
    registered,
    version_mismatch,
)

__all__ = ["GROUPS", "PluginError", "PluginRef", "allowed", "check_allowed", "describe", "is_path", "load",
           "register", "registered", "version_mismatch"]
