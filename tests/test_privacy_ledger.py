"""The privacy ledger, tried as an auditor would: a resume that extends a calibrated run spends no more than its
budget and every line's epsilon is the composition of the lines so far (recomputed here with dp-accounting, from the
line's own fields); a resume that would change what the run promised is refused in one line with nothing written;
and nothing in a run directory gives a released round's noise back (the attack of stepping a stored generator back
to a logged fingerprint)."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import dp_accounting as dp
import numpy as np
import pytest

from fedge.coordinator.config import ConfigError
from fedge.coordinator.rundir import RunDir
from fedge.runtime.launch import play, resolve_run
from tests.e2e import Processes

# A private simulated fleet, small: 12 logical clients trained inline.
PRIVATE = ["model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "data.clients=12",
           "data.train_limit=120", "round.fraction=0.5", "fleet.heartbeat_s=0.5", "run.export_onnx=false",
           "privacy.mode=central", "algorithm.name=fedavg", "train.optimizer=sgd", "train.lr=0.1"]


def start(sets: list[str], run_dir: Path, resume: bool = False, rounds: int = 0) -> dict[str, Any]:
    """`coordinator start` (or `--resume RUN [--rounds N]`) in this process, through the command's own resolution."""
    args = argparse.Namespace(resume=str(run_dir) if resume else None, rounds=rounds or None, set=sets,
                              config=None, service=False, run_dir=str(run_dir))
    plan, path, resuming = resolve_run(args, {"run.run_dir": str(run_dir)})
    return play(plan, RunDir(path), resuming)


def ledger(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "privacy.jsonl").read_text().splitlines() if line.strip()]


def composed(lines: list[dict[str, Any]]) -> list[float]:
    """Epsilon of lines[:k] for every k: the lines' events, each rebuilt from the noise the line says was drawn (the
    values' multiplier and the clip bits' noise), composed in turn with dp-accounting (one accountant; after the
    k-th event it holds exactly what a fresh one composing lines[:k] would)."""
    accountant = dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.ADD_OR_REMOVE_ONE)
    epsilons = []
    for line in lines:
        assert line["sampling"] == "poisson" and line["accountant"] == "rdp"
        z = line["noise_multiplier"]
        assert line["noise_std"] == pytest.approx(z * line["clip"], rel=1e-9)  # the noise drawn is the noise logged
        if line["bits_noise"] > 0:
            z = (z ** -2 + (line["bits_noise"] / 0.5) ** -2) ** -0.5
        accountant.compose(dp.PoissonSampledDpEvent(line["cohort"] / line["population"], dp.GaussianDpEvent(z)))
        epsilons.append(float(accountant.get_epsilon(lines[0]["delta"])))
    return epsilons


def test_a_resume_extending_a_calibrated_run_spends_no_more_than_its_budget(
        procs: Processes, tmp_path: Path) -> None:
    """A run calibrated to epsilon 4 over 3 rounds crashes after round 2 and is resumed with --rounds 8: every
    line's epsilon equals the composition of lines 1..k, never decreases, and the run ends within max_epsilon
    (before the ledger, the resume re-accounted the 2 released rounds at the new plan's noise: epsilon went down,
    and the true total passed 4). A run that has spent its whole budget cannot be extended. The crash ends a
    real coordinator process (its fleet simulated inline); the resumes are played here."""
    run_dir = tmp_path / "run"
    sets = [*PRIVATE, "run.rounds=3", "privacy.target_epsilon=4", "privacy.max_epsilon=4"]
    crashed = procs.cli(sets, run_dir, name="crashed", crash_at="committed:2")
    assert crashed.wait(timeout=240) == 70, procs.output("crashed")[-2000:]
    report = start([], run_dir, resume=True, rounds=8)
    lines = ledger(run_dir)
    assert report["status"] in ("done", "budget") and len(lines) == report["rounds_completed"] >= 6
    for k, epsilon in enumerate(composed(lines), 1):
        assert lines[k - 1]["epsilon"] == pytest.approx(epsilon, rel=1e-6), k
    epsilons = [line["epsilon"] for line in lines]
    assert epsilons == sorted(epsilons) and epsilons[-1] <= 4 + 1e-6
    assert lines[2]["noise_multiplier"] > lines[1]["noise_multiplier"]  # the rounds left carry more noise
    assert report["privacy"]["epsilon"] == epsilons[-1]
    if report["status"] == "done":
        with pytest.raises(ConfigError, match="no budget is left"):
            start([], run_dir, resume=True, rounds=9)


@pytest.mark.parametrize("private,change", [
    (True, ["privacy.noise_multiplier=3"]),
    (False, ["robust.aggregator=multi-krum", "robust.byzantine=1"]),
    (False, ["round.fraction=0.25"]),
])
def test_a_resume_that_changes_a_promise_is_refused_with_nothing_written(tmp_path: Path, private: bool,
                                                                         change: list[str]) -> None:
    run_dir = tmp_path / "run"
    base = [*PRIVATE, "privacy.noise_multiplier=1.0"] if private else \
        [item for item in PRIVATE if not item.startswith("privacy.")]
    assert start([*base, "run.rounds=1"], run_dir)["status"] == "done"
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    with pytest.raises(ConfigError, match=r"a resume may not change what the run promised: " + change[0].split("=")[0]):
        start(change, run_dir, resume=True, rounds=2)
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before
    start(["round.deadline_s=60"], run_dir, resume=True, rounds=2)  # how the run is carried out may change
    assert len(ledger(run_dir)) == 2 if private else (run_dir / "report.json").exists()


def generator_states(value: Any) -> list[dict[str, Any]]:
    """Every numpy bit-generator state stored anywhere in a JSON value."""
    if isinstance(value, dict):
        found = [value] if "bit_generator" in value and "state" in value else []
        return found + [state for item in value.values() for state in generator_states(item)]
    if isinstance(value, list):
        return [state for item in value for state in generator_states(item)]
    return []


def regenerable_rounds(run_dir: Path, max_steps: int) -> list[int]:
    """The attack: every generator state a run directory holds (the checkpoint's meta, any JSON or JSON-lines file),
    stepped back up to ``max_steps`` outputs, matched against the fingerprints the release log gives; the rounds
    whose starting state is so recovered (their noise and cohort can then be drawn again)."""
    found: list[dict[str, Any]] = []
    with np.load(run_dir / "checkpoint.npz") as stored:
        found += generator_states(json.loads(bytes(stored["meta"]).decode()))
    for path in run_dir.rglob("*.json*"):
        for text in path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]:
            found += generator_states(json.loads(text)) if text.strip() else []
    prints = {line.get("generator"): line["round"] for line in ledger(run_dir) if line.get("generator")}
    recovered = []
    for state in found:
        for step in range(max_steps):
            bit_generator = np.random.PCG64()
            bit_generator.state = state
            bit_generator.advance(2 ** 128 - step)
            text = json.dumps(dict(bit_generator.state), sort_keys=True).encode()
            if (fingerprint := hashlib.sha256(text).hexdigest()[:16]) in prints:
                recovered.append(prints[fingerprint])
    return recovered


def test_no_file_gives_back_a_released_rounds_noise(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert start([*PRIVATE, "run.rounds=2", "privacy.noise_multiplier=1.0"], run_dir)["status"] == "done"
    checkpoint = (run_dir / "checkpoint.npz").read_bytes()
    assert start([], run_dir, resume=True, rounds=3)["status"] == "done"  # round 3 starts from that checkpoint
    (run_dir / "checkpoint.npz").write_bytes(checkpoint)  # what an attacker kept of round 2
    assert regenerable_rounds(run_dir, max_steps=64) == []
    assert all("generator" not in line for line in ledger(run_dir))


@pytest.mark.parametrize("momentum,warned", [(0.9, True), (0.0, False)])
def test_heavy_noise_with_an_aggressive_server_step_is_warned_at_start(caplog: pytest.LogCaptureFixture,
                                                                       momentum: float, warned: bool) -> None:
    """z sqrt(d) / m far above 1/2 (12 clients, the MLP): server lr 1 with momentum 0.9 (a step of 10) is warned of
    in one line; without momentum (a step of 1) it is not."""
    from fedge.coordinator.config import load_config
    from fedge.runtime.plan import plan_session

    sets = [*PRIVATE, "privacy.noise_multiplier=1.0", "server.lr=1.0", f"server.momentum={momentum}"]
    with caplog.at_level("WARNING", logger="fedge.coordinator"):
        plan_session(load_config(None, sets))
    lines = [record.getMessage() for record in caplog.records if "random-walk" in record.getMessage()]
    assert len(lines) == (1 if warned else 0) and all("\n" not in line for line in lines)


SPENT_HISTORIES = {  # (sampling, the rounds spent before the calibration, each at its own multiplier)
    "poisson, none spent": ("poisson", ()),
    "poisson, two multipliers spent": ("poisson", (0.9, 0.9, 1.5, 1.5, 1.5, 1.5)),
}


@pytest.mark.parametrize("history", list(SPENT_HISTORIES))
def test_calibration_after_spent_rounds_meets_the_budget_of_a_fresh_full_composition(history: str) -> None:
    """``calibrate`` keeps the spent rounds' divergences and searches only the new rounds' multiplier; an auditor
    composes everything afresh with dp-accounting's own accountant (no cache of Fedge's): the rounds spent and the
    new ones at the calibrated multiplier cost at most the target, and a multiplier a little smaller costs more
    (the search's tolerance is 1e-4). The ledger's sum says the same epsilon."""
    from fedge.coordinator.privacy import RoundEvent, calibrate, ledger_epsilon, make_accountant, round_event

    sampling, spent_multipliers = SPENT_HISTORIES[history]
    population, cohort, rounds, target, delta = 1000, 50.0, 5, 3.0, 1e-5
    spent = [RoundEvent(sampling, population, cohort, z) for z in spent_multipliers]
    multiplier = calibrate(sampling, population, cohort, rounds, target, delta, "rdp", spent)

    def fresh_epsilon(z: float) -> float:
        accountant = make_accountant("rdp", sampling)
        for each, count in Counter([*spent_multipliers, *[z] * rounds]).items():
            accountant.compose(round_event(sampling, population, cohort, each), count)
        return float(accountant.get_epsilon(delta))

    assert fresh_epsilon(multiplier) <= target + 1e-9
    assert fresh_epsilon(multiplier - 1e-3) > target
    everything = [*spent, *[RoundEvent(sampling, population, cohort, multiplier)] * rounds]
    assert ledger_epsilon(everything, delta, "rdp") == pytest.approx(fresh_epsilon(multiplier), rel=1e-9)
