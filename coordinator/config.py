"""The coordinator's configuration: one frozen dataclass per TOML section, loading, overrides and validation.

``load_config`` reads a TOML file (unknown sections or keys are an error), applies ``--set SECTION.KEY=VALUE``
overrides (VALUE parsed as a TOML literal, else taken as a string) and returns a ``Config``. The ``[algorithm]``
section holds ``name`` plus that algorithm's own options, which its Config dataclass validates. docs/config.md lists
every key; a test keeps the two in step. Must not import transports, torch or algorithms' internals.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedge.protocol.influence import InfluenceLimits
from fedge.protocol.robust_rules import AGGREGATORS, RobustRule

# The algorithms a robust aggregator applies to: their updates are dense model or delta uploads averaged with no
# other server state, or (DSSA over those) sparse on the round's shared support (docs/robustness.md says why the
# others are refused); and ef's per-device sparse updates, placed on every coordinate, for the rules that do not
# work coordinate by coordinate (a median or trimmed mean would be zero wherever fewer than half sent a coordinate).
ROBUST_ALGORITHMS = ("fedavg", "fedprox", "dssa-fedavg", "dssa-fedprox", "ef-fedavg", "ef-fedprox")
COORDINATEWISE_RULES = ("median", "trimmed-mean")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# The embedded default (issue 5): Fedge's ef-fedprox with keep 0.3 and ternary values, the sparse mode the harness
# shows best: 94 % fewer bytes than dense FedAvg at a 0.42-point gap (README, "Results"). Faithful DSSA is
# `--algorithm dssa-fedprox` (its options: sparsity, scale, mu, warmup_rounds).
DEFAULT_ALGORITHM: dict[str, Any] = {"name": "ef-fedprox", "keep": 0.3, "value_dtype": "ternary", "mu": 0.01}


@dataclass(frozen=True)
class RunSection:
    rounds: int = 50
    seed: int = 0
    run_dir: str = ""
    export_onnx: bool = True  # write model.onnx at the end (a few seconds; a sweep of many runs may not need it)


FLEET_MODES = ("process", "simulated")
SELECTION_POLICIES = ("uniform", "latency")
FLEET_BACKENDS = ("inline", "local", "ray")


@dataclass(frozen=True)
class FleetSection:
    local_agents: int = 10
    bind: str = ""
    expect: int = 0
    heartbeat_s: float = 2.0
    liveness_s: float = 20.0
    join_timeout_s: float = 180.0
    agent_python: str = ""
    # "process": one real agent process per client; "simulated": data.clients logical clients trained by a pool of
    # workers under the same Session (docs/scale.md). backend: inline, local or ray; workers: 0 = one per core.
    max_uploads: int = 0  # paced uploads: at most this many updates granted and not yet received (0: unpaced)
    mode: str = "process"
    backend: str = "local"
    workers: int = 0
    ray_address: str = ""


@dataclass(frozen=True)
class DataSection:
    dataset: str = "fmnist-demo"
    path: str = ""
    partition: str = "dirichlet"
    alpha: float = 0.3
    clients: int = 0
    classes_per_client: int = 4
    classes_layout: str = "random"
    train_limit: int = 0
    min_size: int = 10
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ModelSection:
    name: str = "cnn"
    pan: str = "off"
    pan_a: float = 0.1
    pan_t: float = 1.0
    input_shape: list[int] = field(default_factory=list)
    outputs: int = 0
    init: str = ""
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainSection:
    epochs: int = 1
    batch_size: int = 64
    lr: float = 0.001
    optimizer: str = "adam"
    momentum: float = 0.0
    weight_decay: float = 0.0
    device: str = "auto"
    loss: str = "cross_entropy"
    class_weights: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RoundSection:
    fraction: float = 1.0
    count: int = 0
    min_clients: int = 1
    deadline_s: float = 300.0
    # Over-selection: close the round once this many updates arrived (0: wait for every selected client); the rest
    # are sent Cancel. policy "latency" prefers agents whose measured round time fits (docs/protocol.md).
    target: int = 0
    policy: str = "uniform"


@dataclass(frozen=True)
class SecuritySection:
    curve: str = "auto"
    keys_dir: str = ""


@dataclass(frozen=True)
class RobustSection:
    """Bounded influence (protocol.influence; docs/robustness.md); the defaults are the protocol's."""

    max_samples: int = InfluenceLimits.max_samples
    cap_factor: float = InfluenceLimits.cap_factor
    norm_factor: float = InfluenceLimits.norm_factor
    norm_bound: float = InfluenceLimits.norm_bound
    aggregator: str = RobustRule.aggregator
    trim: float = RobustRule.trim
    byzantine: int = RobustRule.byzantine
    cc_tau: float = RobustRule.cc_tau
    cc_iters: int = RobustRule.cc_iters
    quarantine_after: int = 0


# The server step ([server], protocol.server_step) moves a global model: the algorithms whose server half keeps one.
SERVER_STEP_ALGORITHMS = ("fedavg", "fedprox", "scaffold")


@dataclass(frozen=True)
class ServerSection:
    lr: float = 1.0
    momentum: float = 0.0


PRIVACY_MODES = ("off", "central")
ACCOUNTANTS = ("rdp", "pld")
# The algorithms client-level DP applies to: their updates are deltas averaged uniformly with no other server state
# (FedAvg, FedProx), on the round's shared support (DSSA over those), or compressed with error feedback on the
# device (ef-*); docs/privacy.md says why the others are refused.
PRIVATE_ALGORITHMS = ("fedavg", "fedprox", "dssa-fedavg", "dssa-fedprox", "ef-fedavg", "ef-fedprox")


@dataclass(frozen=True)
class PrivacySection:
    """Client-level differential privacy (protocol.privacy, coordinator.privacy; docs/privacy.md)."""

    mode: str = "off"
    noise_multiplier: float = 0.0
    target_epsilon: float = 0.0
    clip: float = 1.0
    adaptive_clip: bool = False
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    clip_bits_noise: float = 0.0  # 0: the expected cohort / 20
    delta: float = 0.0            # 0: min(1e-5, 0.1 / population)
    sampling: str = "poisson"
    accountant: str = "rdp"
    max_epsilon: float = 0.0      # 0: no limit
    min_reporters: int = 1

    @property
    def on(self) -> bool:
        return self.mode != "off"


@dataclass(frozen=True)
class EvalSection:
    every: int = 1
    personal_every: int = 0


@dataclass(frozen=True)
class Config:
    run: RunSection = field(default_factory=RunSection)
    fleet: FleetSection = field(default_factory=FleetSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    round: RoundSection = field(default_factory=RoundSection)
    algorithm: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_ALGORITHM))
    security: SecuritySection = field(default_factory=SecuritySection)
    eval: EvalSection = field(default_factory=EvalSection)
    robust: RobustSection = field(default_factory=RobustSection)
    privacy: PrivacySection = field(default_factory=PrivacySection)
    server: ServerSection = field(default_factory=ServerSection)

    @property
    def algorithm_name(self) -> str:
        return str(self.algorithm.get("name", "fedavg"))

    @property
    def algorithm_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.algorithm.items() if k != "name"}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTION_CLASSES: dict[str, type] = {
    "run": RunSection, "fleet": FleetSection, "data": DataSection, "model": ModelSection,
    "train": TrainSection, "round": RoundSection, "security": SecuritySection, "eval": EvalSection,
    "robust": RobustSection, "privacy": PrivacySection, "server": ServerSection,
}


class ConfigError(ValueError):
    """A configuration problem, with a message that names the key (``coordinator`` exits with status 2)."""


class SessionDataError(ConfigError):
    """The session's data set cannot be read or split as configured (``coordinator`` exits with status 3)."""


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
    built["algorithm"] = algorithm
    config = Config(**built)
    validate(config)
    if config.privacy.on:
        config = private(config, raw)
    return config


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


def private(config: Config, raw: dict[str, Any]) -> Config:
    """A session under differential privacy, checked (every combination the guarantee cannot hold with is refused
    in one line, naming the key) and made private: uploads are deltas, weights uniform, and the data-dependent
    bounds off (the clip replaces them)."""
    p, name = config.privacy, config.algorithm_name
    if p.mode not in PRIVACY_MODES:
        extra = " (\"distributed\" arrives with secure aggregation)" if p.mode == "distributed" else ""
        raise ConfigError(f"privacy.mode must be one of {', '.join(PRIVACY_MODES)}, got {p.mode!r}{extra}")
    if name not in PRIVATE_ALGORITHMS:
        raise ConfigError(f"privacy.mode = \"central\" cannot apply to algorithm {name!r}: client-level DP covers "
                          f"{', '.join(PRIVATE_ALGORITHMS)} (docs/privacy.md says why)")
    if (p.noise_multiplier > 0) == (p.target_epsilon > 0):
        raise ConfigError("privacy: set exactly one of privacy.noise_multiplier and privacy.target_epsilon (> 0)")
    numbers = (p.noise_multiplier, p.target_epsilon, p.clip, p.clip_lr, p.clip_bits_noise, p.delta, p.max_epsilon)
    if not all(math.isfinite(v) and v >= 0 for v in numbers) or not p.clip > 0:
        raise ConfigError("privacy: clip must be > 0, and noise_multiplier, target_epsilon, clip_lr, "
                          "clip_bits_noise, delta and max_epsilon finite and >= 0")
    if not 0 < p.target_quantile < 1:
        raise ConfigError("privacy.target_quantile must lie in (0, 1)")
    if p.sampling not in ("poisson", "without-replacement"):
        raise ConfigError(f"privacy.sampling must be poisson or without-replacement, got {p.sampling!r}")
    if p.accountant not in ACCOUNTANTS:
        raise ConfigError(f"privacy.accountant must be one of {', '.join(ACCOUNTANTS)}, got {p.accountant!r}")
    if p.accountant == "pld" and p.sampling != "poisson":
        raise ConfigError("privacy.accountant = \"pld\" cannot account privacy.sampling = \"without-replacement\" "
                          "(dp-accounting's PLD has no fixed-size draw): use accountant = \"rdp\"")
    if p.min_reporters < 1:
        raise ConfigError("privacy.min_reporters must be >= 1")
    if config.fleet.bind and config.fleet.expect < 1:
        raise ConfigError("privacy.mode = \"central\" on a bound fleet needs its population: set fleet.expect (every "
                          "device that may be drawn)")
    population = config.fleet.expect if config.fleet.bind else (config.data.clients or config.fleet.local_agents)
    if p.delta and p.delta >= 1 / population:
        raise ConfigError(f"privacy.delta = {p.delta} must lie below 1/population = 1/{population}")
    if p.sampling == "poisson" and config.round.count:
        raise ConfigError("privacy.sampling = \"poisson\" draws each device with probability round.fraction: "
                          "round.count is for sampling = \"without-replacement\"")
    algorithm = raw.get("algorithm", {})
    refusals = [
        (algorithm.get("upload") == "model", "algorithm.upload = \"model\": updates are deltas under DP"),
        (algorithm.get("weighting") == "samples",
         "algorithm.weighting = \"samples\": a claimed sample count would weigh an update beyond its clip; "
         "weights are uniform under DP"),
        (config.round.target > 0, "round.target: over-selection drops the slow devices, which sampling cannot "
                                  "account for"),
        (config.round.policy != "uniform", "round.policy = \"latency\": the draw must not depend on devices"),
        (config.robust.aggregator != "mean", "robust.aggregator: the clip and the noise replace robust rules"),
        (config.robust.quarantine_after > 0, "robust.quarantine_after: a quarantine changes who may be drawn"),
        (any(raw.get("robust", {}).get(k) for k in ("norm_factor", "norm_bound", "max_samples", "cap_factor")),
         "the [robust] bounds: the DP clip replaces the data-dependent norm bound and the weight cap"),
        (config.eval.personal_every > 0, "eval.personal_every: personal evaluations are not private"),
    ]
    for refused, why in refusals:
        if refused:
            raise ConfigError(f"privacy.mode = \"central\" refuses {why}")
    options = {"upload": "delta", "weighting": "uniform"}
    return dataclasses.replace(config, algorithm={**config.algorithm, **options},
                               robust=dataclasses.replace(config.robust, norm_factor=0.0, norm_bound=0.0,
                                                          cap_factor=0.0, max_samples=0))


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
