"""What a session under differential privacy (``privacy.mode``) or secure aggregation (``secagg.enabled``) refuses,
and the configuration made to fit the guarantee: each combination the guarantee cannot hold with is refused in one
line naming the key, and what the guarantee needs is set (uploads are deltas, weights uniform, the data-dependent
bounds off). ``settle`` applies both to a validated ``Config``. Must not import transports, torch or algorithms'
internals (the model's own refusals, such as integer buffers under secure aggregation, are the plan's).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from fedge.coordinator.sections import Config, ConfigError
from fedge.secagg.field import check_bits, levels_for
from fedge.secagg.graph import MIN_DEVICES

PRIVACY_MODES = ("off", "central", "distributed")
ACCOUNTANTS = ("rdp", "pld")
# The algorithms client-level DP applies to: their updates are deltas averaged uniformly with no other server state
# (FedAvg, FedProx), on the round's shared support (DSSA over those), or compressed with error feedback on the
# device (ef-*); docs/privacy.md says why the others are refused.
PRIVATE_ALGORITHMS = ("fedavg", "fedprox", "dssa-fedavg", "dssa-fedprox", "ef-fedavg", "ef-fedprox")



def private(config: Config, raw: dict[str, Any]) -> Config:
    """A session under differential privacy, checked (every combination the guarantee cannot hold with is refused
    in one line, naming the key) and made private: uploads are deltas, weights uniform, and the data-dependent
    bounds off (the clip replaces them)."""
    p, name = config.privacy, config.algorithm_name
    if p.mode not in PRIVACY_MODES:
        raise ConfigError(f"privacy.mode must be one of {', '.join(PRIVACY_MODES)}, got {p.mode!r}")
    if p.mode == "distributed":
        return distributed(config)
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
    if p.min_reporters != 1:
        raise ConfigError("privacy.min_reporters must be 1: every round runs the mechanism, and whether its noisy sum "
                          "is folded may not depend on how many devices reported (docs/privacy.md)")
    if p.tolerate_colluders:
        raise ConfigError("privacy.tolerate_colluders applies to privacy.mode = \"distributed\": under central DP "
                          "the coordinator adds the noise, and no device's share can be subtracted")
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


# The algorithms secure aggregation sums: their updates are changes averaged uniformly with no other server state,
# dense, or (DSSA over those) on the complement of the round's mask, which every device shares
# (docs/secure-aggregation.md says why the others are refused, and what comes next).
SECURE_ALGORITHMS = ("fedavg", "fedprox", "dssa-fedavg", "dssa-fedprox", "ef-shared-fedavg", "ef-shared-fedprox")


def distributed(config: Config) -> Config:
    """Distributed noise (each device adds its share under secure aggregation; coordinator.skellam accounts it),
    checked: what it cannot hold with is refused in one line, naming the key. The rest of secure aggregation's
    rules (``secure``) apply too."""
    p = config.privacy
    if not config.secagg.enabled:
        raise ConfigError("privacy.mode = \"distributed\" needs secagg.enabled = true: the devices' noise is summed "
                          "under secure aggregation, and no one device's noise is enough")
    if not (math.isfinite(p.noise_multiplier) and p.noise_multiplier > 0):
        raise ConfigError("privacy.mode = \"distributed\" needs privacy.noise_multiplier > 0 (the central noise's "
                          "standard deviation over the clip)")
    if not (math.isfinite(p.clip) and p.clip > 0) or not (math.isfinite(p.delta) and 0 <= p.delta < 1) or \
            not (math.isfinite(p.max_epsilon) and p.max_epsilon >= 0):
        raise ConfigError("privacy: clip must be a finite number > 0, delta lie in [0, 1) and max_epsilon be a "
                          "finite number >= 0")
    population = (config.data.clients or config.fleet.expect) if config.fleet.bind else \
        (config.data.clients or config.fleet.local_agents)
    if p.delta and population and p.delta >= 1 / population:
        raise ConfigError(f"privacy.delta = {p.delta} must lie below 1/population = 1/{population}")
    refusals = [
        (p.target_epsilon > 0, "privacy.target_epsilon: give privacy.noise_multiplier; the epsilon it costs is "
                               "accounted each round"),
        (p.adaptive_clip, "privacy.adaptive_clip: its clip bits would need a secure sum of their own"),
        (p.accountant != "rdp", "privacy.accountant = \"pld\": the Skellam bound is an RDP bound"),
        (p.min_reporters != 1, "privacy.min_reporters: the fewest inputs a sum is unmasked with is the secure "
                               "round's own (n - k + t)"),
        (p.tolerate_colluders < 0, "privacy.tolerate_colluders < 0: it counts devices"),
    ]
    for refused, why in refusals:
        if refused:
            raise ConfigError(f"privacy.mode = \"distributed\" refuses {why}")
    return config


def secure(config: Config, raw: dict[str, Any]) -> Config:
    """A securely aggregated session, checked (every combination the coordinator would need one device's update
    for, or that would leak it, is refused in one line, naming the key) and made to fit: uploads are deltas,
    weights uniform, the data-dependent bounds off (the coordinator never sees an update to measure), and every
    round has at least ``secagg.graph.MIN_DEVICES`` devices."""
    s, name = config.secagg, config.algorithm_name
    try:
        check_bits(s.bits)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if not 0.5 < s.threshold <= 1.0:
        raise ConfigError(f"secagg.threshold = {s.threshold}: it must lie in (0.5, 1] (a threshold of one half or "
                          "less lets two disjoint groups of devices each rebuild a device's secrets)")
    if not (math.isfinite(s.clip_range) and s.clip_range > 0):
        raise ConfigError(f"secagg.clip_range must be a finite number > 0, got {s.clip_range}")
    if s.neighbours < MIN_DEVICES - 1:
        raise ConfigError(f"secagg.neighbours must be >= {MIN_DEVICES - 1}")
    if not (math.isfinite(s.stage_timeout_s) and s.stage_timeout_s > 0):
        raise ConfigError("secagg.stage_timeout_s must be > 0")
    if name not in SECURE_ALGORITHMS:
        raise ConfigError(f"secagg.enabled cannot apply to algorithm {name!r}: secure aggregation sums the changes "
                          f"of {', '.join(SECURE_ALGORITHMS)} on a support every device shares (per-device "
                          "supports would leak: docs/secure-aggregation.md)")
    # the session's population, as the launch counts it (a bound fleet: data.clients or fleet.expect)
    fleet = (config.data.clients or config.fleet.expect) if config.fleet.bind else \
        (config.data.clients or config.fleet.local_agents)
    if fleet and fleet < MIN_DEVICES:
        raise ConfigError(f"secagg.enabled needs at least {MIN_DEVICES} devices (a sum of two inputs gives each "
                          f"device the other's); this fleet has {fleet}")
    if fleet:
        try:
            levels_for(s.bits, fleet)  # a round may select every device: their sum must fit the field
        except ValueError as error:
            raise ConfigError(f"secagg.bits = {s.bits} cannot hold the sum of {fleet} devices' values: raise "
                              f"secagg.bits ({error})") from None
    algorithm = raw.get("algorithm", {})
    refusals = [
        (float(config.algorithm_options.get("uplink_keep", 1.0)) < 1.0,
         "algorithm.uplink_keep < 1: each device would send its own top coordinates, and their positions"),
        (config.privacy.mode == "central", "privacy.mode = \"central\": the coordinator would clip each device's "
                                           "update, which it never sees (use privacy.mode = \"distributed\")"),
        (algorithm.get("upload") == "model", "algorithm.upload = \"model\": the devices mask their change"),
        (algorithm.get("weighting") == "samples",
         "algorithm.weighting = \"samples\": a claimed sample count would weigh a change the coordinator cannot "
         "check; weights are uniform"),
        (config.robust.aggregator != "mean", "robust.aggregator: a robust rule needs each device's update"),
        (config.robust.quarantine_after > 0, "robust.quarantine_after: it needs each device's update"),
        (any(raw.get("robust", {}).get(k) for k in ("norm_factor", "norm_bound", "max_samples", "cap_factor")),
         "the [robust] bounds: they measure each device's update; secagg.clip_range bounds each coordinate"),
        (config.fleet.max_uploads > 0, "fleet.max_uploads: a paced upload waits for a grant the masking stages "
                                       "do not give"),
        (config.eval.personal_every > 0, "eval.personal_every: a personal evaluation is computed from the "
                                         "device's own update"),
    ]
    for refused, why in refusals:
        if refused:
            raise ConfigError(f"secagg.enabled refuses {why}")
    return dataclasses.replace(
        config, algorithm={**config.algorithm, "upload": "delta", "weighting": "uniform"},
        robust=dataclasses.replace(config.robust, norm_factor=0.0, norm_bound=0.0, cap_factor=0.0, max_samples=0),
        round=dataclasses.replace(config.round, min_clients=max(config.round.min_clients, MIN_DEVICES)))


def settle(config: Config, raw: dict[str, Any]) -> Config:
    """The configuration under the guarantees it asks for (``raw``: the keys as given, to tell an explicit value
    from a default)."""
    if config.privacy.on:
        config = private(config, raw)
    if config.secagg.enabled:
        config = secure(config, raw)
    return config
