"""The algorithm registry: a dict literal from name to the module that holds its Config, Server and Client, and the
algorithms that come as plugins (``spec_of``): a name ``package.module:OBJECT`` or an entry point in the
``fedge.algorithms`` group, whose object has ``Config``, ``Server`` and ``Client`` attributes (a module's namespace,
a class), checked against ``ServerHalf`` and ``ClientHalf`` and against the aggregation rule
(``contract.aggregation_refusal``: streaming or batch, never a mix) when it is loaded. A device imports one only after
``fedge.plugins.check_allowed``, as it does model plugins.

Also the three factories the runtime uses, so that neither the coordinator nor the agent names an algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from fedge.algorithms import dssa, ef, ef_shared, fedavg, fedbn, fedcos, fedprox, heurpfedla, pfedla, scaffold
from fedge.algorithms.base import Arrays, ServerContext, config_from_options
from fedge.algorithms.contract import ClientHalf, ServerHalf, aggregation_refusal


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm module and, for wrappers (DSSA, ef-*), the base module it wraps."""

    module: ModuleType | Any  # a module, or a plugin's object with Config, Server and Client
    base: ModuleType | None = None


REGISTRY: dict[str, AlgorithmSpec] = {
    "fedavg": AlgorithmSpec(fedavg),
    "fedprox": AlgorithmSpec(fedprox),
    "scaffold": AlgorithmSpec(scaffold),
    "dssa-fedavg": AlgorithmSpec(dssa, fedavg),
    "dssa-fedprox": AlgorithmSpec(dssa, fedprox),
    "dssa-scaffold": AlgorithmSpec(dssa, scaffold),
    "ef-fedavg": AlgorithmSpec(ef, fedavg),
    "ef-fedprox": AlgorithmSpec(ef, fedprox),
    "ef-shared-fedavg": AlgorithmSpec(ef_shared, fedavg),
    "ef-shared-fedprox": AlgorithmSpec(ef_shared, fedprox),
    "fedbn": AlgorithmSpec(fedbn),
    "pfedla": AlgorithmSpec(pfedla),
    "heurpfedla": AlgorithmSpec(heurpfedla),
    "fedcos": AlgorithmSpec(fedcos),
}


if TYPE_CHECKING:  # mypy checks every shipped half against the contract it is called through
    SERVER_HALVES: tuple[type[ServerHalf], ...] = (fedavg.Server, fedbn.Server, scaffold.Server, pfedla.Server,
                                                   fedcos.Server, dssa.Server, ef.Server)
    CLIENT_HALVES: tuple[type[ClientHalf], ...] = (fedavg.Client, fedprox.Client, fedbn.Client, scaffold.Client,
                                                   pfedla.Client, fedcos.Client, dssa.Client, ef.Client)


_PLUGINS: dict[str, AlgorithmSpec] = {}


def contract_gaps(cls: type, contract: type) -> list[str]:
    """The members of ``contract`` (a Protocol) that ``cls`` lacks."""
    return [name for name in vars(contract) if not name.startswith("_") and not hasattr(cls, name)]


def plugin_spec(name: str) -> AlgorithmSpec:
    """The algorithm a plugin name stands for, loaded and checked against the contract (one-line ValueError)."""
    from fedge.plugins import PluginError, describe, is_path, load

    if name in _PLUGINS:
        return _PLUGINS[name]
    try:
        ref = describe("algorithm", name)
    except PluginError:
        raise ValueError(f"unknown algorithm {name!r}: the built-in ones are {', '.join(sorted(REGISTRY))}; a plugin "
                         "is package.module:OBJECT or a fedge.algorithms entry point, and none is named so") from None
    try:
        target = load(ref)
    except PluginError as exc:
        raise ValueError(str(exc) if is_path(name) else f"algorithm {name!r}: {exc}") from None
    missing = [attr for attr in ("Config", "Server", "Client") if not isinstance(getattr(target, attr, None), type)]
    if missing:
        raise ValueError(f"algorithm plugin {name!r} lacks the class(es) {', '.join(missing)}")
    for attr, contract in (("Server", ServerHalf), ("Client", ClientHalf)):
        gaps = contract_gaps(getattr(target, attr), contract)
        if gaps:
            raise ValueError(f"algorithm plugin {name!r}: its {attr} lacks {', '.join(gaps)} (subclass "
                             f"fedge.algorithms.contract.Base{attr} for the optional hooks' defaults)")
    refusal = aggregation_refusal(getattr(target, "Server"))  # noqa: B009 - checked to be a class above
    if refusal:
        raise ValueError(f"algorithm plugin {name!r}: {refusal}")
    spec = AlgorithmSpec(target)
    _PLUGINS[name] = spec
    return spec


def spec_of(name: str) -> AlgorithmSpec:
    """A built-in algorithm, or a plugin (see the module docstring)."""
    if name in REGISTRY:
        return REGISTRY[name]
    return plugin_spec(name)


def is_builtin(name: str) -> bool:
    return name in REGISTRY


def make_config(name: str, options: Mapping[str, Any]) -> Any:
    """The algorithm's frozen Config from the [algorithm] options (without 'name'); unknown keys are an error."""
    spec = spec_of(name)
    if spec.base is None:
        return config_from_options(spec.module.Config, options)
    return spec.module.make_config(spec.base, options)


def make_server(name: str, options: Mapping[str, Any], initial: Arrays, context: ServerContext) -> ServerHalf:
    spec = spec_of(name)
    refusal = aggregation_refusal(spec.module.Server)
    if refusal:  # a built-in half is held to the same rule as a plugin's
        raise ValueError(refusal)
    config = make_config(name, options)
    if spec.base is None:
        server: ServerHalf = spec.module.Server(config, initial, context)
    else:
        server = spec.module.Server(config, initial, context, spec.base)
    return server


def make_client(name: str, options: Mapping[str, Any], client_index: int) -> ClientHalf:
    spec = spec_of(name)
    config = make_config(name, options)
    if spec.base is None:
        client: ClientHalf = spec.module.Client(config, client_index)
    else:
        client = spec.module.Client(config, client_index, spec.base)
    return client
