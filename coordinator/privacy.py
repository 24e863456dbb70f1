"""Differential privacy in a session: the plan (population, expected cohort, the noise multiplier given or calibrated
for the planned rounds), the accountant, the private generator, the clip, and the release log.

The accounting is Google's ``dp-accounting`` (the optional extra ``fedge[privacy]``), never a hand-written
accountant: each round is one sampled Gaussian event (Poisson sampling: ``PoissonSampledDpEvent`` under
add-or-remove neighbours; a fixed-size draw: ``SampledWithoutReplacementDpEvent`` under replace-one, RDP only),
with the effective noise multiplier of the values and, under adaptive clipping, the clip bits together
(``protocol.privacy.Mechanism.effective_multiplier``).

The release log ``privacy.jsonl`` is a ledger: each line holds its round's event (``RoundEvent``: the sampling,
the population, the expected cohort, the multipliers of the noise actually drawn, the accountant), and epsilon,
wherever it is shown or checked (each line, metrics, report.json, status, the budget stop), is the composition of
the logged events (``ledger_epsilon``), never a plan's multiplier times a count. A round is accounted before
anything derived from its noisy aggregate is written: its line (fsynced) comes first; the row, the evaluation and
the status follow. A round redone after a crash is accounted again with fresh noise, so epsilon never decreases on
resume; a resume that extends a calibrated run calibrates only its remaining rounds against what is left of the
budget (``resumed_plan``). The rules of a round (clip, noise, sums) are the protocol's (``protocol.privacy``);
this module knows no transport and no algorithm.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fedge.coordinator.config import Config, ConfigError, PrivacySection
from fedge.coordinator.rundir import RunDir
from fedge.protocol.privacy import (
    Mechanism,
    PrivateRound,
    Release,
    effective_multiplier,
    fixed_draw,
    fresh_generator,
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
    return ledger_epsilon([RoundEvent(sampling, population, cohort, multiplier)] * max(rounds, 0), delta, accountant)


@dataclass(frozen=True)
class RoundEvent:
    """One accounted round as the ledger records it: a Gaussian of effective multiplier ``multiplier``, sampled at
    ``cohort`` of ``population`` (Poisson) or as a fixed cohort of that size."""

    sampling: str
    population: int
    cohort: float
    multiplier: float

    def dp_event(self) -> Any:
        return round_event(self.sampling, self.population, self.cohort, self.multiplier)


def ledger_epsilon(events: Sequence[RoundEvent], delta: float, accountant: str) -> float:
    """Epsilon at ``delta`` of the composition of ``events`` (identical ones composed together; no event: 0). Under
    RDP each distinct event's Renyi divergences are computed once per process (``event_rdp``) and added up, as the
    accountant's own composition does."""
    if not events:
        return 0.0
    if any(event.multiplier <= 0 for event in events):
        return math.inf
    counted = sorted(Counter(events).items(), key=lambda item: item[0].multiplier)
    if accountant == "rdp":
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        orders, _ = event_rdp(counted[0][0])
        epsilon, _ = compute_epsilon(orders, composed_rdp(counted), delta)
        return float(epsilon)
    tracker = make_accountant(accountant, events[0].sampling)
    for event, count in counted:
        tracker.compose(event.dp_event(), count)
    return float(tracker.get_epsilon(delta))


def composed_rdp(counted: Sequence[tuple[RoundEvent, int]]) -> np.ndarray:
    """The Renyi divergences of ``count`` rounds of each event composed, added in the order given (from zero, as
    dp-accounting's RDP accountant adds each composed event to its own)."""
    total = np.zeros_like(event_rdp(counted[0][0])[1]) if counted else np.zeros(0)
    for event, count in counted:
        total = total + count * event_rdp(event)[1]
    return total


@functools.lru_cache(maxsize=64)
def event_rdp(event: RoundEvent) -> tuple[np.ndarray, np.ndarray]:
    """(orders, Renyi divergences) of one round's event, from dp-accounting's RDP accountant."""
    tracker = make_accountant("rdp", event.sampling)
    tracker.compose(event.dp_event())
    return np.asarray(tracker._orders, np.float64), np.asarray(tracker._rdp, np.float64)


def calibrate(sampling: str, population: int, cohort: float, rounds: int, target_epsilon: float, delta: float,
              accountant: str, spent: Sequence[RoundEvent] = ()) -> float:
    """The smallest effective noise multiplier whose ``rounds`` rounds, composed after the rounds already ``spent``,
    cost at most ``target_epsilon``. PLD is searched between a third of RDP's answer and RDP's answer (RDP's bound
    is the looser one, so it needs at least as much noise; a PLD at a tiny multiplier would need gigabytes).
    Calibrated once per process for the same figures (a search composes the event a dozen times, seconds each)."""
    return _calibrate(sampling, population, cohort, rounds, target_epsilon, delta, accountant, tuple(spent))


@functools.lru_cache(maxsize=16)
def _calibrate(sampling: str, population: int, cohort: float, rounds: int, target_epsilon: float, delta: float,
               accountant: str, spent: tuple[RoundEvent, ...]) -> float:
    dp = dp_accounting()
    counted = list(Counter(spent).items())
    before = [dp.SelfComposedDpEvent(event.dp_event(), count) for event, count in counted]

    def rdp_after_spent() -> Any:
        """An RDP accountant holding the rounds spent, their divergences computed once (``event_rdp``) and added
        in the order the composed event adds them: the same sums as composing them at every step of the search."""
        tracker = make_accountant("rdp", sampling)
        if counted:
            tracker._rdp = tracker._rdp + composed_rdp(counted)
        return tracker

    def search(kind: str, bracket: Any) -> float:
        if kind == "rdp":
            return float(dp.calibrate_dp_mechanism(
                rdp_after_spent,
                lambda z: dp.SelfComposedDpEvent(round_event(sampling, population, cohort, z), rounds),
                target_epsilon, delta, bracket_interval=bracket, tol=1e-4))
        return float(dp.calibrate_dp_mechanism(
            lambda: make_accountant(kind, sampling),
            lambda z: dp.ComposedDpEvent([*before, dp.SelfComposedDpEvent(
                round_event(sampling, population, cohort, z), rounds)]),
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
    """A private session's figures, fixed before its first round (or, on a resume, before its next one)."""

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

    @property
    def event(self) -> RoundEvent:
        """What one round of this plan is accounted as."""
        return RoundEvent(self.settings.sampling, self.population, self.cohort, self.effective)

    def epsilon(self, rounds: int, spent: Sequence[RoundEvent] = ()) -> float:
        """Epsilon after the rounds ``spent`` and ``rounds`` more of this plan."""
        return ledger_epsilon([*spent, *[self.event] * rounds], self.delta, self.settings.accountant)


def population_of(config: Config) -> int:
    """N: a local fleet's clients, a simulated fleet's ``data.clients``, or a bound fleet's ``fleet.expect``."""
    if config.fleet.bind:
        return config.fleet.expect
    if config.fleet.mode == "simulated":
        return config.data.clients or config.fleet.local_agents
    return config.data.clients or config.fleet.local_agents


def bits_multiplier_of(settings: PrivacySection, cohort: float) -> tuple[float, float]:
    """(sigma_b, z_b): the clip bits' noise std and its multiplier (infinite under a fixed clip)."""
    bits = settings.clip_bits_noise or cohort / 20
    if not settings.adaptive_clip:
        return 0.0, math.inf
    return bits, bits / (0.5 if settings.sampling == "poisson" else 1.0)


def with_effective(plan: PrivacyPlan, effective: float) -> PrivacyPlan:
    """The plan with another effective multiplier (the values' z derived from it as at the start)."""
    _, bits_multiplier = bits_multiplier_of(plan.settings, plan.cohort)
    try:
        values = values_multiplier(effective, bits_multiplier)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return replace(plan, effective=effective, mechanism=replace(plan.mechanism, noise_multiplier=values))


def make_plan(config: Config, spent: Sequence[RoundEvent] = (), completed: int = 0) -> PrivacyPlan:
    """The plan of a session with ``privacy.mode = "central"`` (the configuration has checked each key); a resumed
    one's from its ledger's ``spent`` events and its ``completed`` rounds (``resumed_plan``)."""
    settings = config.privacy
    population = population_of(config)
    if settings.sampling == "poisson":
        cohort = config.round.fraction * population
    else:
        cohort = float(config.round.count or math.ceil(config.round.fraction * population))
    delta = settings.delta or min(1e-5, 0.1 / population)
    bits, bits_multiplier = bits_multiplier_of(settings, cohort)
    adaptive = settings.adaptive_clip
    mechanism = Mechanism(noise_multiplier=settings.noise_multiplier, denominator=cohort, sampling=settings.sampling,
                          adaptive=adaptive, target_quantile=settings.target_quantile, clip_lr=settings.clip_lr,
                          bits_noise=bits if adaptive else 0.0)
    plan = PrivacyPlan(settings, population, cohort, delta, effective_multiplier(settings.noise_multiplier,
                                                                                 bits_multiplier), mechanism,
                       config.run.rounds)
    if settings.target_epsilon <= 0:
        return plan
    if spent:
        return resumed_plan(plan, spent, completed)
    return with_effective(plan, calibrate(settings.sampling, population, cohort, plan.rounds,
                                          settings.target_epsilon, delta, settings.accountant))


def read_ledger(run_dir: RunDir) -> list[RoundEvent]:
    """The events of a run's release log; ConfigError for a log written before the ledger (no events)."""
    events = []
    for number, line in enumerate(run_dir.read_jsonl(RELEASE_LOG), 1):
        try:
            events.append(RoundEvent(str(line["sampling"]), int(line["population"]), float(line["cohort"]),
                                     float(line["effective_multiplier"])))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{run_dir / RELEASE_LOG} line {number} records no privacy event (a log written "
                              "before the ledger, or damaged): this run cannot be resumed") from None
    return events


def resumed_plan(plan: PrivacyPlan, spent: Sequence[RoundEvent], completed: int) -> PrivacyPlan:
    """A resumed calibrated session's plan: the multiplier its last logged round used when the logged rounds and the
    rounds left (``plan.rounds`` less the ``completed`` ones) stay within ``target_epsilon`` at it; otherwise
    (``--rounds`` extended the run, or rounds were redone after a crash) the rounds left calibrated against what is
    left of the budget, or a one-line refusal when nothing is left."""
    target, left = plan.settings.target_epsilon, plan.rounds - completed
    logged = with_effective(plan, spent[-1].multiplier)
    if left <= 0 or logged.epsilon(left, spent) <= target * (1 + 1e-9):
        return logged
    already = ledger_epsilon(spent, plan.delta, plan.settings.accountant)
    if already >= target * (1 - 1e-3):  # (a calibrated run ends within the calibration's tolerance of its target)
        raise ConfigError(f"privacy: the run has spent epsilon {already:.4g} of privacy.target_epsilon = {target:g}; "
                          f"no budget is left for {left} more round(s)")
    settings = plan.settings
    effective = calibrate(settings.sampling, plan.population, plan.cohort, left, target, plan.delta,
                          settings.accountant, spent)
    log.info("privacy: the %d round(s) left are calibrated against the budget left (epsilon %.4g spent of %g): "
             "noise multiplier %.4g", left, already, target, effective)
    return with_effective(plan, effective)


class SessionPrivacy:
    """A private session's state: the clip, the accounted rounds (the ledger); see the module docstring.
    ``generators`` gives each draw and each release a generator: by default a new one from OS entropy every time,
    so that no file holds a state from which a released round's noise or cohort could be regenerated (a test that
    compares noisy runs passes its own)."""

    def __init__(self, plan: PrivacyPlan, run_dir: RunDir,
                 generators: Callable[[], np.random.Generator] = fresh_generator) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.clip = plan.settings.clip
        self.generators = generators
        self.ledger: list[RoundEvent] = []
        self.epsilon = 0.0
        self.last: Release | None = None

    @property
    def accounted(self) -> int:
        return len(self.ledger)

    @property
    def norm_bounds(self) -> dict[str, float]:
        """What a task announces: every device clips its whole update to the round's clip."""
        return {"*": self.clip}

    def draw(self, number: int) -> list[int]:
        """This round's cohort from the whole population, from a fresh private generator (the draws must stay
        secret for amplification by sampling to hold)."""
        rng = self.generators()
        if self.plan.settings.sampling == "poisson":
            return poisson_draw(self.plan.population, self.plan.rate, rng)
        return fixed_draw(self.plan.population, int(round(self.plan.cohort)), rng)

    def open_round(self) -> PrivateRound:
        return PrivateRound(self.plan.mechanism, self.clip, self.generators())

    def over_budget(self) -> bool:
        """Whether accounting one more round would take epsilon past ``max_epsilon`` (0: no limit)."""
        limit = self.plan.settings.max_epsilon
        return limit > 0 and self.plan.epsilon(1, self.ledger) > limit

    def account(self, number: int, release: Release | None, reporters: int) -> dict[str, Any]:
        """Round ``number`` closed: its line in the ledger (its event, and epsilon composed over every line so
        far), fsynced, before anything derived from it is written; the clip moves on. Returns metrics.jsonl's
        privacy fields. A round with no update (nothing to release a change on) is accounted too."""
        plan, mechanism = self.plan, self.plan.mechanism
        event = plan.event
        self.ledger.append(event)
        self.epsilon = ledger_epsilon(self.ledger, plan.delta, plan.settings.accountant)
        clip = release.clip if release is not None else self.clip
        noise_std = release.noise_std if release is not None else mechanism.noise_std(self.clip)
        line = {"round": number, "accounted": self.accounted, "released": release is not None,
                "epsilon": self.epsilon, "delta": plan.delta, "accountant": plan.settings.accountant,
                "sampling": event.sampling, "population": event.population, "cohort": event.cohort,
                "noise_multiplier": mechanism.noise_multiplier, "bits_noise": mechanism.bits_noise,
                "effective_multiplier": event.multiplier, "clip": clip, "noise_std": noise_std}
        self.run_dir.append_jsonl(RELEASE_LOG, line, durable=True)
        if release is not None:
            self.clip = release.next_clip
            self.last = release
        else:
            log.warning("round %d: no update, nothing released (the round is accounted)", number)
        return {"epsilon": self.epsilon, "clip": clip, "noise_std": noise_std, "dp_released": release is not None}

    def state(self) -> dict[str, Any]:
        return {"privacy": {"clip": self.clip, "accounted": self.accounted}}

    def load_state(self, meta: Mapping[str, Any], round_number: int) -> None:
        """The checkpoint's clip; the ledger's rounds. A round released after the checkpoint (a crash between its
        release and its checkpoint) stays accounted, and its redo draws fresh noise (every draw does)."""
        state = dict(meta.get("privacy", {}))
        self.clip = float(state.get("clip", self.clip))
        self.ledger = read_ledger(self.run_dir)
        self.epsilon = ledger_epsilon(self.ledger, self.plan.delta, self.plan.settings.accountant)
        beyond = [line for line in self.run_dir.read_jsonl(RELEASE_LOG) if int(line.get("round", 0)) > round_number]
        if beyond:
            log.warning("privacy: %d round(s) after the checkpoint were released before the crash; they stay "
                        "accounted (epsilon %.4g) and their redo draws fresh noise", len(beyond), self.epsilon)

    def status(self) -> dict[str, Any]:
        """status.json's ``privacy``: what `coordinator status` shows."""
        settings = self.plan.settings
        return {"epsilon": self.epsilon, "delta": self.plan.delta, "accountant": settings.accountant,
                "sampling": settings.sampling, "rounds": self.accounted, "clip": self.clip,
                "max_epsilon": settings.max_epsilon or None}

    def report(self) -> dict[str, Any]:
        """report.json's ``privacy``: the summary; the ledger (privacy.jsonl) holds every event epsilon composes."""
        plan = self.plan
        last_clip = self.last.clip if self.last is not None else self.clip
        return {"epsilon": self.epsilon, "delta": plan.delta, "accountant": plan.settings.accountant,
                "sampling": plan.settings.sampling, "population": plan.population, "cohort": plan.cohort,
                "noise_std": plan.mechanism.noise_std(last_clip), "clip": last_clip,
                "noise_multiplier": plan.effective, "values_noise_multiplier": plan.mechanism.noise_multiplier,
                "adaptive_clip": plan.mechanism.adaptive, "clip_bits_noise": plan.mechanism.bits_noise,
                "rounds": self.accounted, "ledger": RELEASE_LOG, "max_epsilon": plan.settings.max_epsilon or None}
