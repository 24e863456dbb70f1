"""Differential privacy in real sessions: epsilon recomputed from report.json alone, the budget that stops a run,
crashes that never release twice unaccounted, the population a bound fleet is sampled from, and every combination
the guarantee cannot hold with refused in one line with nothing written. Sessions are played in this process
(a simulated fleet, inline; the bound fleet's agents joining over loopback TCP in threads), but for the crash (a
coordinator process that exits at a named point)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import dp_accounting as dp
import pytest

from fedge.coordinator.config import ConfigError, load_config
from fedge.meter.report import write_report
from fedge.runtime.cli import main as coordinator
from fedge.runtime.plan import plan_session
from tests.e2e import Processes, shards, wait_for
from tests.simfleet import InProcessSessions, read_jsonl, run_here

# A private simulated fleet, small: 12 logical clients trained inline, 3 rounds, a tenth of a second a task.
PRIVATE = ["model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "data.clients=12",
           "data.train_limit=120", "run.rounds=3", "round.fraction=0.5", "fleet.heartbeat_s=0.5",
           "run.export_onnx=false", "privacy.mode=central", "algorithm.name=fedavg", "train.optimizer=sgd",
           "train.lr=0.1"]


def epsilon_from_records(privacy: dict[str, Any]) -> float:
    """Epsilon from report.json's figures alone, the events built here with dp-accounting: q = cohort /
    population, and the values' noise multiplier is the std added to the sum over its sensitivity (C under
    add-or-remove, 2C under replace-one), joined by the clip bits' under adaptive clipping."""
    poisson = privacy["sampling"] == "poisson"
    multiplier = privacy["noise_std"] / ((1.0 if poisson else 2.0) * privacy["clip"])
    if privacy["adaptive_clip"]:
        bits = privacy["clip_bits_noise"] / (0.5 if poisson else 1.0)
        multiplier = (multiplier ** -2 + bits ** -2) ** -0.5
    gaussian = dp.GaussianDpEvent(multiplier)
    if poisson:
        event: Any = dp.PoissonSampledDpEvent(privacy["cohort"] / privacy["population"], gaussian)
        relation = dp.NeighboringRelation.ADD_OR_REMOVE_ONE
    else:
        event = dp.SampledWithoutReplacementDpEvent(privacy["population"], int(privacy["cohort"]), gaussian)
        relation = dp.NeighboringRelation.REPLACE_ONE
    accountant: Any = dp.pld.PLDAccountant(relation) if privacy["accountant"] == "pld" else \
        dp.rdp.RdpAccountant(neighboring_relation=relation)
    accountant.compose(event, privacy["rounds"])
    return float(accountant.get_epsilon(privacy["delta"]))


@pytest.mark.parametrize("extra", [
    ["privacy.noise_multiplier=0.9"],
    ["privacy.noise_multiplier=0.9", "privacy.sampling=without-replacement", "round.count=5"],
    ["privacy.noise_multiplier=0.9", "privacy.accountant=pld"],
    ["privacy.target_epsilon=6", "privacy.adaptive_clip=true", "privacy.clip=0.05", "privacy.clip_bits_noise=3"],
], ids=["poisson-rdp", "fixed-size-rdp", "poisson-pld", "poisson-rdp-adaptive-calibrated"])
def test_epsilon_is_recomputed_from_report_json_alone(sessions: InProcessSessions, tmp_path: Path,
                                                       extra: list[str]) -> None:
    report = sessions.run([*PRIVATE, *extra])
    privacy = report["privacy"]
    assert report["status"] == "done" and privacy["population"] == 12 and privacy["rounds"] == 3
    assert privacy["epsilon"] == pytest.approx(epsilon_from_records(privacy), rel=1e-6, abs=1e-6)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [row["epsilon"] for row in rows] == sorted(row["epsilon"] for row in rows)
    assert rows[-1]["epsilon"] == privacy["epsilon"] and all(row["noise_std"] > 0 for row in rows)
    if "privacy.target_epsilon=6" in extra:
        assert privacy["epsilon"] <= 6 + 1e-6 and rows[0]["clip"] == 0.05 and rows[-1]["clip"] != 0.05
    assert oct((tmp_path / "run" / "checkpoint.npz").stat().st_mode & 0o777) == "0o600"


def test_a_run_stops_before_a_release_would_exceed_max_epsilon(sessions: InProcessSessions, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    sets = [*PRIVATE, "privacy.noise_multiplier=1.0", "run.rounds=10"]
    plan = plan_session(load_config(None, sets)).privacy
    limit = (plan.epsilon(2) + plan.epsilon(3)) / 2  # two rounds fit, the third would not
    run_dir = tmp_path / "run"
    report = sessions.run([*sets, f"privacy.max_epsilon={limit}"], status="budget")
    assert report["status"] == "budget" and report["rounds_completed"] == 2
    assert report["privacy"]["epsilon"] <= limit < plan.epsilon(3)
    assert (run_dir / "model.npz").exists()  # the last released model is the run's result
    # what an operator sees: `coordinator status`, the Prometheus gauge, and `coordinator report`'s plot
    capsys.readouterr()
    assert coordinator(["status", str(run_dir)]) == 0
    shown = capsys.readouterr().out
    assert f"privacy: epsilon {report['privacy']['epsilon']:.4g} at delta 1e-05 after 2 accounted" in shown
    assert "fedge_privacy_epsilon" in (run_dir / "fedge.prom").read_text()
    write_report(run_dir)
    assert (run_dir / "meter-privacy.png").stat().st_size > 0
    assert "meter-privacy.png" in (run_dir / "meter-report.md").read_text()


def test_a_round_released_before_a_crash_stays_accounted_and_is_redone(
        procs: Processes, sessions: InProcessSessions, tmp_path: Path) -> None:
    """Crash after round 2's release (its clients.jsonl written, its checkpoint not): on resume, round 2 is redone
    and accounted again, so epsilon counts 4 rounds for 3 released, and never decreases. Every draw is fresh OS
    entropy, so the redo cannot replay the first attempt's noise (tests/test_privacy_ledger.py tries to regenerate
    a round's noise from the files). The crash ends a real coordinator process (the simulated fleet inline in
    it); the resume is played here, through the resume rules."""
    sets = [*PRIVATE, "privacy.noise_multiplier=1.0"]
    run_dir = tmp_path / "run"
    crashed = procs.cli(sets, run_dir, name="crashed", crash_at="clients:2")
    assert crashed.wait(timeout=240) == 70, procs.output("crashed")
    before = read_jsonl(run_dir / "privacy.jsonl")
    assert [line["round"] for line in before] == [1, 2]
    assert sessions.resume()["status"] == "done"
    lines = read_jsonl(run_dir / "privacy.jsonl")
    assert [line["round"] for line in lines] == [1, 2, 2, 3]
    assert [line["accounted"] for line in lines] == [1, 2, 3, 4]
    epsilons = [line["epsilon"] for line in lines]
    assert epsilons == sorted(epsilons) and epsilons[2] > before[-1]["epsilon"]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["privacy"]["rounds"] == 4 and report["privacy"]["epsilon"] == epsilons[-1]


def test_a_bound_fleet_is_sampled_from_its_whole_population(tmp_path: Path) -> None:
    """fleet.expect = 6 devices, 2 of them online: each round draws from all 6, the drawn offline ones are
    dropouts, and the accounting's q is the cohort over the population, never over the devices online. The
    coordinator serves on loopback TCP and the two devices join it there as agents (``api.run_agent``), all of
    them threads of this process (agent processes: tests/test_e2e_run.py)."""
    from fedge.api import run_agent

    data, run_dir = shards(tmp_path, 2), tmp_path / "run"
    sets = ["fleet.bind=tcp://127.0.0.1:0", "fleet.expect=6", "run.rounds=4", "model.name=mlp",
            "data.train_limit=300", "fleet.heartbeat_s=0.5", "fleet.liveness_s=6.0", "run.export_onnx=false",
            "data.partition=iid", "fleet.join_timeout_s=4", "round.fraction=0.5", "privacy.mode=central",
            "privacy.noise_multiplier=1.0", "round.deadline_s=30", "algorithm.name=fedavg"]
    done: dict[str, Any] = {}

    def serve() -> None:
        try:
            done["report"] = run_here(sets, run_dir)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's own thread
            done["error"] = exc

    coordinator = threading.Thread(target=serve, daemon=True)
    coordinator.start()
    address = wait_for(lambda: "error" in done or (run_dir / "endpoint").exists() and
                       (run_dir / "endpoint").read_text().strip(), 60, "the endpoint file")
    assert "error" not in done, done
    agents = [threading.Thread(target=run_agent, args=(address, f"dev-{i}", str(data / f"client-{i:03d}.npz"),
                                                       tmp_path / f"state-{i}"), daemon=True) for i in range(2)]
    for agent in agents:
        agent.start()
    coordinator.join(180)
    for agent in agents:
        agent.join(60)
    assert "report" in done and not coordinator.is_alive(), done
    privacy = json.loads((run_dir / "report.json").read_text())["privacy"]
    assert privacy["population"] == 6 and privacy["cohort"] == 3.0
    assert privacy["epsilon"] == pytest.approx(epsilon_from_records(privacy), rel=1e-6)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    # no offline device drawn in 4 rounds: (1/2)^16, once in 65,536 runs
    assert sum(row["dp_dropouts"] for row in rows) > 0 and all(row["selected"] <= 2 for row in rows)


REFUSED = [
    (["algorithm.weighting=\"samples\""], "algorithm.weighting"),
    (["algorithm.upload=\"model\""], "algorithm.upload"),
    (["round.target=2"], "round.target"),
    (["round.policy=\"latency\""], "round.policy"),
    (["robust.aggregator=\"median\""], "robust.aggregator"),
    (["robust.quarantine_after=3"], "robust.quarantine_after"),
    (["robust.norm_factor=2.0"], "the [robust] bounds"),
    (["eval.personal_every=1"], "eval.personal_every"),
    (["algorithm.name=\"scaffold\""], "cannot apply to algorithm 'scaffold'"),
    (["algorithm.name=\"fedbn\""], "cannot apply to algorithm 'fedbn'"),
    (["algorithm.name=\"fedcos\""], "cannot apply to algorithm 'fedcos'"),
    (["algorithm.name=\"pfedla\""], "cannot apply to algorithm 'pfedla'"),
    (["algorithm.name=\"heurpfedla\""], "cannot apply to algorithm 'heurpfedla'"),
    (["model.name=\"cnn-bn\""], "integer buffers"),
    (["privacy.sampling=\"without-replacement\"", "privacy.accountant=\"pld\""], "has no fixed-size draw"),
    (["privacy.mode=\"distributed\""], "needs secagg.enabled = true"),
    (["privacy.target_epsilon=4"], "exactly one of"),
    (["privacy.delta=0.2"], "below 1/population"),
    (["round.count=3"], "round.count is for"),
    (["privacy.min_reporters=3"], "every round runs the mechanism"),
    (["privacy.tolerate_colluders=2"], "applies to privacy.mode = \"distributed\""),
    (["fleet.mode=\"process\"", "fleet.bind=\"tcp://127.0.0.1:0\"", "data.dataset=\"\""], "needs its population"),
    (["fleet.mode=\"process\"", "fleet.bind=\"tcp://127.0.0.1:0\"", "fleet.expect=4", "data.dataset=\"\"",
      "model.input_shape=[1, 28, 28]", "model.outputs=10"], "needs a test set"),
]


@pytest.mark.parametrize("extra, reason", REFUSED, ids=[reason for _, reason in REFUSED])
def test_each_combination_dp_cannot_hold_with_is_refused_in_one_line(extra: list[str], reason: str) -> None:
    sets = [s for s in PRIVATE if not s.startswith("model.name") or "model.name" not in " ".join(extra)]
    with pytest.raises(ConfigError, match=None) as refused:
        plan_session(load_config(None, [*sets, "privacy.noise_multiplier=1.0", *extra]))
    message = str(refused.value)
    assert reason in message and "\n" not in message, message


def test_a_refused_private_session_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``coordinator start`` (its ``main``, here; a refusal from a real process: tests/test_e2e_run.py)."""
    run_dir = tmp_path / "run"
    sets = [*PRIVATE, "privacy.noise_multiplier=1", "algorithm.weighting=\"samples\""]
    code = coordinator(["start", "--run-dir", str(run_dir), *[a for s in sets for a in ("--set", s)]])
    stderr = capsys.readouterr().err
    assert code == 2 and not run_dir.exists()
    assert stderr.strip().count("\n") == 0 and "weights are uniform under DP" in stderr
