"""The coordinator's configuration: loading, overrides and validation of the sections ``coordinator.sections``
defines.

``load_config`` reads a TOML file (unknown sections or keys are an error), applies ``--set SECTION.KEY=VALUE``
overrides (VALUE parsed as a TOML literal, else taken as a string) and returns a ``Config``, checked
(``validate``) and, under differential privacy or secure aggregation, made to fit the guarantee
(``coordinator.guarantees``). The ``[algorithm]`` section holds ``name`` plus that algorithm's own options, which its
Config dataclass validates. docs/config.md lists every key; a test keeps the two in step. Must not import
transports, torch or algorithms' internals.
"""

from __future__ import annotations

import math
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from fedge.coordinator.guarantees import settle
from fedge.coordinator.sections import (
    ASYNC_ALGORITHMS,
    COORDINATEWISE_RULES,
    DEFAULT_ALGORITHM,
    FLEET_BACKENDS,
    FLEET_CLOCKS,
    FLEET_MODES,
    ROBUST_ALGORITHMS,
    ROUND_MODES,
    SECTION_CLASSES,
    SELECTION_POLICIES,
    SERVER_STEP_ALGORITHMS,
    Config,
    ConfigError,
    PrivacySection,
    RobustSection,
    SecAggSection,
    SessionDataError,
)
from fedge.protocol.robust_rules import AGGREGATORS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["SECTION_CLASSES", "Config", "ConfigError", "PrivacySection", "RobustSection", "SecAggSection",
           "SessionDataError", "from_dict", "load_config", "local_clients", "parse_override", "to_toml", "tomllib",
           "validate"]


def _coerce(section: str, key: str, expected: Any, value: Any) -> Any:
    if isinstance(expected, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{section}.{key} must be true or false, got {value!r}")
        return value
    if isinstance(expected, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{section}.{key} must be an integer, got {value!r}")
        return value
    if isinstance(expected, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{section}.{key} must be a number, got {value!r}")
        return float(value)
    if isinstance(expected, str):
        if not isinstance(value, str):
            raise ConfigError(f"{section}.{key} must be a string, got {value!r}")
        return value
    if isinstance(expected, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{section}.{key} must be a table, got {value!r}")
        return dict(value)
    if isinstance(expected, list):
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                              for v in value):
            raise ConfigError(f"{section}.{key} must be a list of numbers, got {value!r}")
        return list(value)
    return value


def from_dict(raw: dict[str, Any]) -> Config:
    """Build a Config from nested mappings, refusing unknown sections and keys."""
    unknown = set(raw) - set(SECTION_CLASSES) - {"algorithm"}
    if unknown:
        raise ConfigError(f"unknown section(s) {sorted(unknown)}; known: {sorted([*SECTION_CLASSES, 'algorithm'])}")
    built: dict[str, Any] = {}
    for name, cls in SECTION_CLASSES.items():
        values = raw.get(name, {})
        if not isinstance(values, dict):
            raise ConfigError(f"[{name}] must be a table")
        defaults = cls()
        known = {f.name for f in fields(cls)}
        bad = set(values) - known
        if bad:
            raise ConfigError(f"unknown key(s) {sorted(bad)} in [{name}]; known: {sorted(known)}")
        built[name] = cls(**{k: _coerce(name, k, getattr(defaults, k), v) for k, v in values.items()})
    algorithm = dict(raw.get("algorithm", {}))
    if "name" not in algorithm:  # options without a name adjust the embedded default
        algorithm = {**DEFAULT_ALGORITHM, **algorithm}
    if not isinstance(algorithm["name"], str):
        raise ConfigError("algorithm.name must be a string")
    if built["round"].mode == "async" and algorithm["name"] in ASYNC_ALGORITHMS:
        algorithm.setdefault("upload", "delta")  # an asynchronous update is a change from its task's base
    built["algorithm"] = algorithm
    config = Config(**built)
    validate(config)
    return settle(config, raw)


def parse_override(text: str) -> tuple[str, str, Any]:
    """'SECTION.KEY=VALUE' -> (section, key, value); VALUE is a TOML literal, else a plain string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set takes SECTION.KEY=VALUE, got {text!r}")
    dotted, literal = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {literal.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = literal.strip()
    return section, key, value


def merge(raw: dict[str, Any], section: str, key: str, value: Any) -> None:
    table = raw.setdefault(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] must be a table")
    table[key] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                flags: dict[str, Any] | None = None) -> Config:
    """Read the TOML file (if any), then apply flag shorthands, then ``--set`` overrides, then validate."""
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    for dotted, value in (flags or {}).items():
        if value is not None:
            section, key = dotted.split(".", 1)
            merge(raw, section, key, value)
    for text in overrides:
        merge(raw, *parse_override(text))
    return from_dict(raw)


def validate(config: Config) -> None:
    """Cross-key checks that a dataclass alone cannot express."""
    if config.run.rounds < 1:
        raise ConfigError("run.rounds must be >= 1")
    if config.fleet.local_agents < 0 or config.fleet.expect < 0:
        raise ConfigError("fleet.local_agents and fleet.expect must be >= 0")
    if not config.fleet.bind and config.fleet.local_agents < 1:
        raise ConfigError("with no fleet.bind the coordinator runs a local fleet: fleet.local_agents must be >= 1")
    fleet = config.fleet
    if fleet.mode not in FLEET_MODES:
        raise ConfigError(f"fleet.mode must be one of {', '.join(FLEET_MODES)}, got {fleet.mode!r}")
    if fleet.backend not in FLEET_BACKENDS:
        raise ConfigError(f"fleet.backend must be one of {', '.join(FLEET_BACKENDS)}, got {fleet.backend!r}")
    if fleet.max_uploads < 0:
        raise ConfigError("fleet.max_uploads must be >= 0 (0: agents send their update as soon as it is trained)")
    if fleet.workers < 0:
        raise ConfigError("fleet.workers must be >= 0 (0: one per CPU core)")
    if fleet.mode == "simulated" and fleet.bind:
        raise ConfigError("a simulated fleet runs on this machine's workers: fleet.mode = \"simulated\" takes no "
                          "fleet.bind")
    if fleet.clock not in FLEET_CLOCKS:
        raise ConfigError(f"fleet.clock must be one of {', '.join(FLEET_CLOCKS)}, got {fleet.clock!r}")
    if fleet.clock == "simulated" and fleet.mode != "simulated":
        raise ConfigError("fleet.clock = \"simulated\" times a simulated fleet's tasks: it needs fleet.mode = "
                          "\"simulated\"")
    if fleet.clock != "simulated" and (fleet.max_seconds or fleet.trace):
        raise ConfigError("fleet.max_seconds and fleet.trace count simulated seconds: they need fleet.clock = "
                          "\"simulated\" (a real device's budget is its own agent.max_seconds)")
    if fleet.ray_address and fleet.backend != "ray":
        raise ConfigError("fleet.ray_address is for fleet.backend = \"ray\"")
    if not 0 < config.round.fraction <= 1:
        raise ConfigError("round.fraction must be in (0, 1]")
    if config.round.target < 0:
        raise ConfigError("round.target must be >= 0 (0: wait for every selected client)")
    if config.round.count and config.round.target > config.round.count:
        raise ConfigError(f"round.target ({config.round.target}) cannot exceed round.count ({config.round.count})")
    if config.round.policy not in SELECTION_POLICIES:
        raise ConfigError(f"round.policy must be one of {', '.join(SELECTION_POLICIES)}, got {config.round.policy!r}")
    if config.round.deadline_s <= 0:
        raise ConfigError("round.deadline_s must be > 0")
    if config.round.mode not in ROUND_MODES:
        raise ConfigError(f"round.mode must be one of {', '.join(ROUND_MODES)}, got {config.round.mode!r}")
    if config.round.mode == "async":
        validate_async(config)
    if config.security.curve not in ("auto", "on", "off"):
        raise ConfigError("security.curve must be auto, on or off")
    if config.train.device not in ("auto", "cpu", "cuda"):
        raise ConfigError("train.device must be auto, cpu or cuda")
    if config.eval.every < 0 or config.eval.personal_every < 0:
        raise ConfigError("eval.every and eval.personal_every must be >= 0")
    robust = config.robust
    if robust.max_samples < 0:
        raise ConfigError("robust.max_samples must be >= 0 (0: the largest shard, or derived from round 1's claims)")
    if robust.cap_factor != 0 and robust.cap_factor < 1:
        raise ConfigError("robust.cap_factor must be >= 1 (0: no cap derived from round 1's claims)")
    if robust.norm_factor < 0 or robust.norm_bound < 0:
        raise ConfigError("robust.norm_factor and robust.norm_bound must be >= 0 (0: off)")
    if not all(math.isfinite(v) for v in (robust.cap_factor, robust.norm_factor, robust.norm_bound)):
        raise ConfigError("robust.cap_factor, robust.norm_factor and robust.norm_bound must be finite")
    if robust.aggregator not in AGGREGATORS:
        raise ConfigError(f"robust.aggregator must be one of {', '.join(AGGREGATORS)}, got {robust.aggregator!r}")
    if robust.aggregator != "mean" and config.algorithm_name not in ROBUST_ALGORITHMS:
        raise ConfigError(f"robust.aggregator = {robust.aggregator!r} cannot apply to algorithm "
                          f"{config.algorithm_name!r}: robust aggregators combine the dense updates of "
                          f"{', '.join(ROBUST_ALGORITHMS)} only (the bounds apply to every algorithm)")
    if robust.aggregator in COORDINATEWISE_RULES and config.algorithm_name.startswith("ef-"):
        raise ConfigError(f"robust.aggregator = {robust.aggregator!r} cannot apply to {config.algorithm_name}: each "
                          "device sends its own top coordinates, so a coordinate-wise rule is zero wherever fewer than "
                          "half of them sent it; use multi-krum or centered-clip")
    if robust.aggregator != "mean" and float(config.algorithm_options.get("uplink_keep", 1.0)) < 1.0:
        raise ConfigError(f"robust.aggregator = {robust.aggregator!r} cannot apply with algorithm.uplink_keep < 1: "
                          "each device then sends its own top coordinates, not values on the round's shared support")
    if not 0 <= robust.trim < 0.5 or robust.byzantine < 0:
        raise ConfigError("robust.trim must be in [0, 0.5) and robust.byzantine >= 0")
    if robust.quarantine_after < 0:
        raise ConfigError("robust.quarantine_after must be >= 0 (0: no quarantine)")
    if not (math.isfinite(robust.cc_tau) and robust.cc_tau > 0) or robust.cc_iters < 1:
        raise ConfigError("robust.cc_tau must be > 0 and robust.cc_iters >= 1")
    step = config.server
    if not (math.isfinite(step.lr) and step.lr > 0) or not 0 <= step.momentum < 1:
        raise ConfigError("server.lr must be > 0 and server.momentum in [0, 1)")
    if (step.lr != 1 or step.momentum != 0) and config.algorithm_name not in SERVER_STEP_ALGORITHMS:
        raise ConfigError(f"server.lr and server.momentum move a global model: they apply to "
                          f"{', '.join(SERVER_STEP_ALGORITHMS)}, not to {config.algorithm_name!r}")
    if any(not isinstance(d, int) or d < 1 for d in config.model.input_shape):
        raise ConfigError(f"model.input_shape must be positive integers, got {config.model.input_shape}")
    if config.model.outputs < 0:
        raise ConfigError("model.outputs must be >= 1 (0: taken from the data)")
    if len(config.data.mean) != len(config.data.std):
        raise ConfigError("data.mean and data.std need the same number of values (one per channel)")
    if any(s <= 0 for s in config.data.std):
        raise ConfigError("data.std values must be > 0")
    if config.data.min_size < 0:
        raise ConfigError("data.min_size must be >= 0")
    if not config.data.dataset and not config.fleet.bind:
        raise ConfigError("a local fleet trains on a data set: set data.dataset (only a session bound for real "
                          "devices, fleet.bind, may have none)")


def validate_async(config: Config) -> None:
    """What asynchronous rounds take, and what they refuse in one line (docs/protocol.md, "Asynchronous rounds")."""
    try:
        config.asynchronous.settings()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    name = config.algorithm_name
    if name not in ASYNC_ALGORITHMS:
        raise ConfigError(f"round.mode = \"async\" runs {', '.join(ASYNC_ALGORITHMS)}, not {name!r}: an algorithm "
                          "joins once its server folds a stale delta under its staleness discount (docs/algorithms.md, "
                          "\"Asynchronous rounds\")")
    if config.algorithm_options.get("upload", "delta") != "delta":
        raise ConfigError("round.mode = \"async\" needs algorithm.upload = \"delta\": an update is a change from "
                          "its task's base version, applied to the version current when it arrives")
    refused = [
        (config.round.target > 0, "round.target (over-selection): asynchronous.concurrency sets how many train"),
        (config.round.policy != "uniform", "round.policy = \"latency\": every idle device may take the next task"),
        (config.fleet.max_uploads > 0, "fleet.max_uploads (paced uploads): asynchronous.concurrency bounds the "
                                       "updates in flight"),
        (config.privacy.on, "privacy: its accountant counts rounds of sampled devices, not buffered versions"),
        (config.secagg.enabled, "secure aggregation: its masks cancel within one round's cohort"),
        (config.robust.aggregator != "mean", f"robust.aggregator = {config.robust.aggregator!r}: only the mean "
                                             "(with the norm bound, measured per version)"),
    ]
    for bad, what in refused:
        if bad:
            raise ConfigError(f"round.mode = \"async\" does not take {what}")


def local_clients(config: Config) -> int:
    """How many clients a local fleet holds: one per agent process, or a simulated fleet's data.clients."""
    if config.fleet.mode == "simulated":
        return config.data.clients or config.fleet.local_agents
    count = config.fleet.local_agents
    clients = config.data.clients or count
    if clients != count:
        raise ConfigError(f"a local fleet runs one agent per client: data.clients ({clients}) != agents ({count}); "
                          "for more clients than processes use fleet.mode = \"simulated\"")
    return count


def to_toml(config: Config) -> str:
    import tomli_w

    return tomli_w.dumps(config.to_dict())
