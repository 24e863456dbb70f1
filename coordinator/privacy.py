"""Differential privacy in a session: the plan (population, expected cohort, the noise multiplier given or calibrated
for the planned rounds), the accountant, the private generator, the clip, and the release log.

The accounting is Google's ``dp-accounting`` (the optional extra ``fedge[privacy]``), never a hand-written
accountant: each released round is one sampled Gaussian event (Poisson sampling: ``PoissonSampledDpEvent`` under
add-or-remove neighbours; a fixed-size draw: ``SampledWithoutReplacementDpEvent`` under replace-one, RDP only),
with the effective noise multiplier of the values and, under adaptive clipping, the clip bits together
(``protocol.privacy.Mechanism.effective_multiplier``). ``epsilon_of`` is the one function that turns a run's
figures into epsilon; report.json holds every figure it takes, so an auditor can recompute it.

A round is accounted before anything derived from its noisy aggregate is written: its line in ``privacy.jsonl``
(fsynced) comes first; the row, the evaluation and the status follow. A round redone after a crash is accounted
again with fresh noise, so epsilon never decreases on resume. The rules of a round (clip, noise, sums) are the
protocol's (``protocol.privacy``); this module knows no transport and no algorithm.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedge.coordinator.config import Config, ConfigError, PrivacySection
from fedge.coordinator.rundir import RunDir
from fedge.protocol.privacy import (
    Mechanism,
    NoiseSource,
    PrivateRound,
    Release,
    effective_multiplier,
    fixed_draw,
    poisson_draw,
    values_multiplier,
)

log = logging.getLogger("fedge.coordinator")

RELEASE_LOG = "privacy.jsonl"
INSTALL_HINT = "bash scripts/install.sh (its default, coordinator profile), or pip install 'fedge[privacy]'"


def dp_accounting() -> Any:
    """The ``dp_accounting`` module, or a one-line ConfigError saying how to install it."""
    try:
        import dp_accounting as module
    except ImportError:
        raise ConfigError(f"differential privacy (privacy.mode) needs Google's dp-accounting: {INSTALL_HINT}") from None
    logging.getLogger("absl").setLevel(logging.ERROR)  # its RDP orders that do not converge are dropped, loudly
    return module


def round_event(sampling: str, population: int, cohort: float, multiplier: float) -> Any:
    """One round's DP event: a Gaussian of noise multiplier ``multiplier``, Poisson-sampled at q = cohort /
    population, or drawn as a fixed cohort of ``cohort`` without replacement."""
    dp = dp_accounting()
    gaussian = dp.GaussianDpEvent(multiplier)
    if sampling == "poisson":
        return dp.PoissonSampledDpEvent(cohort / population, gaussian)
    return dp.SampledWithoutReplacementDpEvent(population, int(round(cohort)), gaussian)


def make_accountant(accountant: str, sampling: str) -> Any:
    dp = dp_accounting()
    relation = dp.NeighboringRelation.ADD_OR_REMOVE_ONE if sampling == "poisson" else \
        dp.NeighboringRelation.REPLACE_ONE
    if accountant == "pld":
        return dp.pld.PLDAccountant(neighboring_relation=relation)
    return dp.rdp.RdpAccountant(neighboring_relation=relation)


def epsilon_of(sampling: str, population: int, cohort: float, multiplier: float, rounds: int, delta: float,
               accountant: str) -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds of the sampled Gaussian (0 rounds: 0)."""
    if rounds <= 0:
        return 0.0
    if multiplier <= 0:
        return math.inf
    tracker = make_accountant(accountant, sampling)
    tracker.compose(round_event(sampling, population, cohort, multiplier), rounds)
    return float(tracker.get_epsilon(delta))


def calibrate(sampling: str, population: int, cohort: float, rounds: int, target_epsilon: float, delta: float,
              accountant: str) -> float:
    """The smallest effective noise multiplier whose ``rounds`` rounds cost at most ``target_epsilon``. PLD is
    searched between a third of RDP's answer and RDP's answer (RDP's bound is the looser one, so it needs at least
    as much noise; a PLD at a tiny multiplier would need gigabytes)."""
    dp = dp_accounting()

    def search(kind: str, bracket: Any) -> float:
        return float(dp.calibrate_dp_mechanism(
            lambda: make_accountant(kind, sampling),
            lambda z: dp.SelfComposedDpEvent(round_event(sampling, population, cohort, z), rounds),
            target_epsilon, delta, bracket_interval=bracket, tol=1e-4))

    try:
        multiplier = search("rdp", dp.LowerEndpointAndGuess(1e-3, 1.0))
        if accountant == "pld":
            multiplier = search("pld", dp.ExplicitBracketInterval(multiplier / 3, multiplier))
    except Exception as exc:  # dp-accounting's own message names what failed
        raise ConfigError(f"privacy.target_epsilon = {target_epsilon}: no noise multiplier found ({exc})") from None
    return float(multiplier)


@dataclass(frozen=True)
class PrivacyPlan:
    """A private session's figures, fixed before round 1."""

    settings: PrivacySection
    population: int        # N: every client that may be drawn
    cohort: float          # the expected cohort: q N (Poisson) or the fixed size
    delta: float
    effective: float       # the noise multiplier accounted each round (values and clip bits together)
    mechanism: Mechanism
    rounds: int            # the planned rounds

    @property
    def rate(self) -> float:
        return self.cohort / self.population

    def epsilon(self, rounds: int) -> float:
        return epsilon_of(self.settings.sampling, self.population, self.cohort, self.effective, rounds, self.delta,
                          self.settings.accountant)


def population_of(config: Config) -> int:
    """N: a local fleet's clients, a simulated fleet's ``data.clients``, or a bound fleet's ``fleet.expect``."""
    if config.fleet.bind:
        return config.fleet.expect
    if config.fleet.mode == "simulated":
        return config.data.clients or config.fleet.local_agents
    return config.data.clients or config.fleet.local_agents


def make_plan(config: Config) -> PrivacyPlan:
    """The plan of a session with ``privacy.mode = "central"`` (the configuration has checked each key)."""
    settings = config.privacy
    population = population_of(config)
    if settings.sampling == "poisson":
        cohort = config.round.fraction * population
    else:
        cohort = float(config.round.count or math.ceil(config.round.fraction * population))
    delta = settings.delta or min(1e-5, 0.1 / population)
    bits = settings.clip_bits_noise or cohort / 20
    adaptive = settings.adaptive_clip
    bits_multiplier = bits / (0.5 if settings.sampling == "poisson" else 1.0) if adaptive else math.inf
    rounds = config.run.rounds
    if settings.target_epsilon > 0:
        effective = calibrate(settings.sampling, population, cohort, rounds, settings.target_epsilon, delta,
                              settings.accountant)
    else:
        effective = effective_multiplier(settings.noise_multiplier, bits_multiplier)
    try:
        values = values_multiplier(effective, bits_multiplier) if settings.target_epsilon > 0 else \
            settings.noise_multiplier
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    mechanism = Mechanism(noise_multiplier=values, denominator=cohort, sampling=settings.sampling, adaptive=adaptive,
                          target_quantile=settings.target_quantile, clip_lr=settings.clip_lr,
                          bits_noise=bits if adaptive else 0.0)
    return PrivacyPlan(settings, population, cohort, delta, effective, mechanism, rounds)


class SessionPrivacy:
    """A private session's state: the clip, the generator, the accounted rounds; see the module docstring."""

    def __init__(self, plan: PrivacyPlan, run_dir: RunDir) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.clip = plan.settings.clip
        self.noise = NoiseSource()
        self.accounted = 0      # rounds in the release log
        self.epsilon = 0.0
        self.last: Release | None = None
        self.started_from = ""  # the generator's fingerprint at the round's start (before its draw)

    @property
    def norm_bounds(self) -> dict[str, float]:
        """What a task announces: every device clips its whole update to the round's clip."""
        return {"*": self.clip}

    def draw(self, number: int) -> list[int]:
        """This round's cohort from the whole population, from the private generator (the draws must stay secret
        for amplification by sampling to hold)."""
        self.started_from = self.noise.fingerprint()
        rng = self.noise.generator
        if self.plan.settings.sampling == "poisson":
            return poisson_draw(self.plan.population, self.plan.rate, rng)
        return fixed_draw(self.plan.population, int(round(self.plan.cohort)), rng)

    def open_round(self) -> PrivateRound:
        return PrivateRound(self.plan.mechanism, self.clip, self.noise.generator, self.plan.settings.min_reporters)

    def over_budget(self) -> bool:
        """Whether accounting one more round would take epsilon past ``max_epsilon`` (0: no limit)."""
        limit = self.plan.settings.max_epsilon
        return limit > 0 and self.plan.epsilon(self.accounted + 1) > limit

    def account(self, number: int, release: Release | None, reporters: int) -> dict[str, Any]:
        """Round ``number`` closed: its line in the release log, fsynced, before anything derived from it is
        written; the clip moves on. Returns metrics.jsonl's privacy fields. A round not released (fewer than
        ``min_reporters``) is accounted too: whether it was released depends on who reported."""
        self.accounted += 1
        self.epsilon = self.plan.epsilon(self.accounted)
        clip = release.clip if release is not None else self.clip
        noise_std = release.noise_std if release is not None else self.plan.mechanism.noise_std(self.clip)
        line = {"round": number, "accounted": self.accounted, "released": release is not None,
                "epsilon": self.epsilon, "delta": self.plan.delta, "clip": clip, "noise_std": noise_std,
                "generator": self.started_from}
        self.run_dir.append_jsonl(RELEASE_LOG, line, durable=True)
        if release is not None:
            self.clip = release.next_clip
            self.last = release
        else:
            log.warning("round %d: %d update(s), fewer than privacy.min_reporters = %d: not released (accounted)",
                        number, reporters, self.plan.settings.min_reporters)
        return {"epsilon": self.epsilon, "clip": clip, "noise_std": noise_std, "dp_released": release is not None}

    def state(self) -> dict[str, Any]:
        return {"privacy": {"clip": self.clip, "noise": self.noise.state(), "accounted": self.accounted}}

    def load_state(self, meta: Mapping[str, Any], round_number: int) -> None:
        """The checkpoint's clip and generator; the release log's rounds. A round released after the checkpoint
        (a crash between its release and its checkpoint) stays accounted, and the generator is reseeded so that
        its redo draws fresh noise (and a fresh cohort)."""
        state = dict(meta.get("privacy", {}))
        self.clip = float(state.get("clip", self.clip))
        if "noise" in state:
            self.noise.load_state(state["noise"])
        lines = self.run_dir.read_jsonl(RELEASE_LOG)
        self.accounted = len(lines)
        self.epsilon = self.plan.epsilon(self.accounted)
        beyond = [line for line in lines if int(line.get("round", 0)) > round_number]
        if beyond:
            self.noise.reseed()
            log.warning("privacy: %d round(s) after the checkpoint were released before the crash; they stay "
                        "accounted (epsilon %.4g) and their redo draws fresh noise", len(beyond), self.epsilon)

    def status(self) -> dict[str, Any]:
        """status.json's ``privacy``: what `coordinator status` shows."""
        settings = self.plan.settings
        return {"epsilon": self.epsilon, "delta": self.plan.delta, "accountant": settings.accountant,
                "sampling": settings.sampling, "rounds": self.accounted, "clip": self.clip,
                "max_epsilon": settings.max_epsilon or None}

    def report(self) -> dict[str, Any]:
        """report.json's ``privacy``: every figure ``epsilon_of`` takes, so that epsilon can be recomputed."""
        plan = self.plan
        last_clip = self.last.clip if self.last is not None else self.clip
        return {"epsilon": self.epsilon, "delta": plan.delta, "accountant": plan.settings.accountant,
                "sampling": plan.settings.sampling, "population": plan.population, "cohort": plan.cohort,
                "noise_std": plan.mechanism.noise_std(last_clip), "clip": last_clip,
                "noise_multiplier": plan.effective, "values_noise_multiplier": plan.mechanism.noise_multiplier,
                "adaptive_clip": plan.mechanism.adaptive, "clip_bits_noise": plan.mechanism.bits_noise,
                "rounds": self.accounted, "max_epsilon": plan.settings.max_epsilon or None}
