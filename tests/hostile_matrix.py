"""The hostile matrix: the modes under attack, what each cell compares, and its verdict, for
tests/test_hostile_cells.py (a selection) and benchmarks/attacks.py --hostile (all of it).

A mode is a composition (an algorithm, a robust rule, central DP, distributed noise, secure aggregation, the
asynchronous engine); a cell is a mode and one mutation of tests/hostile.py. ``Recorded`` keeps, per mode, its plan,
its honest frames (tests/hostile_rounds.py ``record``, once) and the rounds the cells compare with, each replayed
once: without the attacker's update (``refused``), with it honest (``harmless``), honest claiming the weight cap
(``bounded``), honest rounded through float16 (``rounded``) or with its sections' values zero (``zeroed``). A secure
mode's cells are played live (``live``), against the round in which the attacker did not send that message.
``verdict`` says why a cell fails, or ''. Modes whose devices send the same frames share one recording (a robust
rule is the coordinator's alone: the devices train and send as under the mean).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedge import codec
from tests.hostile import BOUNDED, HARMLESS, REFUSED, ROUNDED, ZEROED, Mutation, rounded_f16, zeroed
from tests.hostile_rounds import (
    Closed,
    Mode,
    Recording,
    earlier_answers,
    live,
    plan_of,
    record,
    replay,
    with_samples,
)

# bounds preset (nothing holds: round 1 streams) unless a mode says otherwise; the cap is the shard limit
PRESET = ("robust.max_samples=16", "robust.norm_bound=1000")
ALGORITHMS = ("fedavg", "fedprox", "scaffold", "dssa-fedavg", "dssa-fedprox", "dssa-scaffold", "ef-fedavg",
              "ef-fedprox", "ef-shared-fedavg", "ef-shared-fedprox", "fedbn", "pfedla", "heurpfedla", "fedcos")
WARMUP = ("algorithm.warmup_rounds=0",)
ASYNC = ("round.mode=async", "asynchronous.buffer=3", "asynchronous.concurrency=4", "asynchronous.max_staleness=4")


def algorithm_mode(name: str) -> Mode:
    return Mode(name, (f"algorithm.name={name}", *PRESET, *(WARMUP if name.startswith("dssa") else ()),
                       "run.rounds=1"), attacked=1)


def robust_mode(name: str, algorithm: str, *sets: str) -> Mode:
    return Mode(name, (f"algorithm.name={algorithm}", *sets, *PRESET, "run.rounds=1"), attacked=1,
                records=algorithm)


MODES: tuple[Mode, ...] = (
    *(algorithm_mode(name) for name in ALGORITHMS),
    # round 2 of derived bounds (round 1 held its updates to measure them; round 2 streams), and of ef's keyframes
    Mode("fedavg-derived-r2", ("algorithm.name=fedavg",), attacked=2),
    Mode("ef-fedavg-r2", ("algorithm.name=ef-fedavg", *PRESET), attacked=2),
    Mode("dssa-fedavg-r2", ("algorithm.name=dssa-fedavg", "algorithm.warmup_rounds=1", *PRESET), attacked=2),
    *(robust_mode(f"fedavg+{rule}", "fedavg", f"robust.aggregator={rule}", "robust.byzantine=1")
      for rule in ("trimmed-mean", "median", "multi-krum", "centered-clip")),
    robust_mode("fedavg+centered-clip-3", "fedavg", "robust.aggregator=centered-clip", "robust.cc_iters=3"),
    robust_mode("ef-fedavg+multi-krum", "ef-fedavg", "robust.aggregator=multi-krum", "robust.byzantine=1"),
    Mode("fedavg+central-dp", ("algorithm.name=fedavg", "privacy.mode=central", "privacy.noise_multiplier=1.0",
                               "privacy.sampling=without-replacement", "round.fraction=1.0", "algorithm.upload=delta",
                               "run.rounds=1"), attacked=1),
    Mode("fedavg+async", ("algorithm.name=fedavg", *ASYNC, *PRESET, "run.rounds=1"), attacked=1),
    Mode("ef-fedavg+async", ("algorithm.name=ef-fedavg", *ASYNC, *PRESET, "run.rounds=1"), attacked=1),
)
SECURE_MODES: tuple[Mode, ...] = (
    Mode("fedavg+secagg", ("algorithm.name=fedavg", "secagg.enabled=true", "fleet.clock=simulated",
                           "run.rounds=1"), attacked=1, secure=True),
    Mode("fedavg+distributed-noise", ("algorithm.name=fedavg", "secagg.enabled=true", "privacy.mode=distributed",
                                      "privacy.noise_multiplier=1.0", "fleet.clock=simulated", "run.rounds=1"),
         attacked=1, secure=True),
)
# the plain mutations a secure mode's masked update gets too (the rest need a tensor layout it does not have)
SECURE_PLAIN = ("no-groups", "missing-tensor", "extra-tensor", "int32", "negative-samples", "zero-samples",
                "reserved-meta", "other-run", "previous-round", "truncated", "garbage", "over-limit")
REFUSED_COMBINATIONS: tuple[tuple[str, ...], ...] = (
    *((f"algorithm.name={a}", f"robust.aggregator={r}") for a in ("scaffold", "pfedla", "heurpfedla", "fedcos",
                                                                  "fedbn") for r in ("median", "multi-krum")),
    ("algorithm.name=ef-fedavg", "robust.aggregator=median"),
    ("algorithm.name=ef-fedavg", "robust.aggregator=trimmed-mean"),
    *(("round.mode=async", f"algorithm.name={a}") for a in ("scaffold", "dssa-fedavg", "fedbn", "pfedla")),
    ("round.mode=async", "algorithm.name=fedavg", "privacy.mode=central", "privacy.noise_multiplier=1.0"),
    ("round.mode=async", "algorithm.name=fedavg", "secagg.enabled=true"),
    ("round.mode=async", "algorithm.name=fedavg", "robust.aggregator=median"),
)


# where a mode's outcome is not the mutation's own: ef-shared's values lie on the round's published support, and an
# emptied section is an index section, on no support (DSSA and ef take it as a zero update)
OUTCOMES: dict[tuple[str, str], str] = {("ef-shared-", "empty-sparse-section"): REFUSED}


def outcome(mode: Mode, mutation: Mutation, honest: codec.Update) -> str:
    algorithm = next((s.split("=", 1)[1] for s in mode.sets if s.startswith("algorithm.name=")), "")
    found = [o for (prefix, name), o in OUTCOMES.items() if name == mutation.name and algorithm.startswith(prefix)]
    return found[0] if found else mutation.outcome(honest)


def mode(name: str) -> Mode:
    return next(m for m in (*MODES, *SECURE_MODES) if m.name == name)


def refused_plan(sets: tuple[str, ...]) -> Any:
    """The plan of a combination the configuration must refuse (raises its ConfigError)."""
    return plan_of(Mode("refused", (*sets, "robust.byzantine=1", "run.rounds=1")))


class Recorded:
    """Per mode, once: its plan, its honest frames, and the rounds the cells compare with."""

    def __init__(self) -> None:
        self.plans: dict[tuple[str, ...], Any] = {}
        self.recordings: dict[str, Recording | Exception] = {}
        self.expected: dict[tuple[str, str], Closed] = {}

    def plan(self, mode: Mode) -> Any:
        """``mode``'s plan, made once for its settings (a mode and its recording share it where they are equal)."""
        key = tuple(mode.overrides)
        if key not in self.plans:
            self.plans[key] = plan_of(mode)
        return self.plans[key]

    def recording(self, mode: Mode) -> Recording:
        source = next((m for m in MODES if m.name == mode.records), mode) if mode.records else mode
        if source.name not in self.recordings:
            recorded = source
            if "round.mode=async" in source.sets:  # the device left out of version 1 answers too (in version 2)
                recorded = Mode(source.name, (*source.sets, "run.rounds=2"), source.attacked)
            try:
                self.recordings[source.name] = record(recorded, self.plan(recorded))
            except Exception as exc:  # kept, so that the mode's other cells fail at once with the same reason
                self.recordings[source.name] = exc
        found = self.recordings[source.name]
        if isinstance(found, Exception):
            raise AssertionError(f"{source.name}: its honest session could not be recorded: {found!r}") from found
        return found

    def honest(self, mode: Mode) -> codec.Update:
        frame, _ = earlier_answers(self.recording(mode), mode)
        update = codec.decode(frame)
        assert isinstance(update, codec.Update)
        return update

    def closed(self, mode: Mode, expect: str) -> Closed:
        """The round the cells of outcome ``expect`` compare with (see the module's docstring)."""
        key = (mode.name, expect)
        if key not in self.expected:
            recording = self.recording(mode)
            honest, _ = earlier_answers(recording, mode)
            frames = {REFUSED: lambda: [], HARMLESS: lambda: [honest],
                      BOUNDED: lambda: [with_samples(honest, recording.weight_cap)],
                      ROUNDED: lambda: [codec.encode(rounded_f16(self.honest(mode)))],
                      ZEROED: lambda: [codec.encode(zeroed(self.honest(mode)))]}[expect]()
            self.expected[key] = replay(mode, self.plan(mode), recording, frames)
            assert self.expected[key].error is None, self.expected[key].error
            if expect == HARMLESS:
                without = self.closed(mode, REFUSED)
                assert self.expected[key].differs(without), f"{mode.name}: the attacker's update changes nothing"
        return self.expected[key]

    def cell(self, mode: Mode, mutation: Mutation) -> tuple[Closed, Closed, str]:
        """One cell: the round closed with the attacker's task answered by ``mutation``'s frames, the round it
        must equal, and the outcome expected."""
        recording = self.recording(mode)
        honest, earlier = earlier_answers(recording, mode)
        expect = outcome(mode, mutation, self.honest(mode))
        closed = replay(mode, self.plan(mode), recording, mutation.make(honest, earlier))
        return closed, self.closed(mode, expect), expect

    def live(self, mode: Mode, kind: type, change: Callable[[bytes], list[bytes]] | None) -> Closed:
        return live(mode, self.plan(mode), kind, change)

    def live_expected(self, mode: Mode, kind: type, expect: str) -> Closed:
        key = (mode.name, f"{expect}:{kind.__name__}")
        if key not in self.expected:
            self.expected[key] = self.live(mode, kind if expect == REFUSED else codec.Update,
                                           None if expect == REFUSED else (lambda f: [f]))
            assert self.expected[key].error is None, self.expected[key].error
        return self.expected[key]


def verdict(closed: Closed, expected: Closed, expect: str) -> str:
    """Why a cell fails ('' when it holds): an exception escaped the session, a refusal named no device, or the
    closed round differs from the one expected."""
    if closed.error is not None:
        return f"an exception escaped the session: {closed.error}"
    named = [w for w in closed.warnings if closed.attacker in w]
    if expect == REFUSED and not named:
        return f"refused with no warning naming {closed.attacker} (warnings: {closed.warnings[-3:]})"
    differs = closed.differs(expected)
    if differs:
        return f"the closed round differs from the round {expect} in {differs[:4]} (warnings naming the " \
               f"device: {named[:2]})"
    return ""
