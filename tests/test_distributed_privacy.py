"""``privacy.mode = "distributed"`` in sessions: every device adds its share of the Skellam noise before masking, the
coordinator folds the noisy mean (never one without the noise), each round is accounted in privacy.jsonl before its
sum is kept, epsilon is recomputable from those lines, a round with fewer inputs than the noise shares assume is
not released, and what the guarantee cannot hold with is refused in one line."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from fedge.coordinator.config import ConfigError, load_config
from fedge.coordinator.skellam import SkellamRound, epsilon_of, total_rdp
from fedge.runtime.cli import main as coordinator
from fedge.secagg.distributed import NoisyGrid
from tests.simfleet import overrides, read_jsonl, run_here

DISTRIBUTED = ("algorithm.name=fedavg", "secagg.enabled=true", "privacy.mode=\"distributed\"",
               "privacy.noise_multiplier=0.5", "privacy.clip=1.0")


@dataclass
class Recorded:
    """A 3-round session of 6 devices with distributed noise, played once for the module, and what it drew:
    each device's clipped change and its grid, and each round's folded (noisy, unmasked) mean."""

    run_dir: Path
    changes: list[np.ndarray] = field(default_factory=list)
    grids: list[NoisyGrid] = field(default_factory=list)
    folded: list[np.ndarray] = field(default_factory=list)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    from fedge.protocol.server_half import Aggregation

    seen = Recorded(tmp_path_factory.mktemp("distributed") / "run")
    integers, fold = NoisyGrid.integers, Aggregation.fold_secure_mean

    def recording_integers(self: NoisyGrid, change: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        norm = float(np.linalg.norm(change))
        seen.changes.append(change * min(1.0, self.clip / norm) if norm else change)
        seen.grids.append(self)
        return integers(self, change, rng)

    def recording_fold(self: Aggregation, groups: dict, contributor: tuple[str, int], contributors: list[int]) -> None:
        (group,) = groups.values()
        seen.folded.append(np.concatenate([np.asarray(v).ravel() for v in group.dense.values()]))
        fold(self, groups, contributor, contributors)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(NoisyGrid, "integers", recording_integers)
        patch.setattr(Aggregation, "fold_secure_mean", recording_fold)
        run_here(overrides("fedavg", 1.0, "simulated", "inline", (*DISTRIBUTED, "run.rounds=3")),
                 seen.run_dir)
    return seen


@pytest.mark.xdist_group("distributed_privacy")
def test_the_model_moves_by_the_clipped_mean_plus_every_devices_noise(recorded: Recorded) -> None:
    changes, grids, folded = recorded.changes, recorded.grids, recorded.folded
    assert len(changes) == 18 and len(folded) == 3
    lines = read_jsonl(recorded.run_dir / "privacy.jsonl")
    for number in range(3):
        grid, release = grids[6 * number], int(lines[number]["release"])
        assert math.isclose(grid.noise * release, (grid.scale * 0.5 * 1.0) ** 2)  # each device: sigma^2 / release
        error = folded[number] - np.mean(changes[6 * number:6 * number + 6], axis=0)
        expected = math.sqrt(6 * grid.noise) / grid.scale / 6  # all six devices' noise, on the mean
        assert 0.95 < float(error.std()) / expected < 1.05, number
    rows = read_jsonl(recorded.run_dir / "metrics.jsonl")
    recomputed = epsilon_of(total_rdp([SkellamRound(r["l2"], r["l1"], r["variance"]) for r in lines]), 1e-5)
    report = json.loads((recorded.run_dir / "report.json").read_text())["privacy"]
    assert [r["epsilon"] for r in rows] == [line["epsilon"] for line in lines]
    assert rows[0]["epsilon"] < rows[1]["epsilon"] < rows[2]["epsilon"] == report["epsilon"] == \
        pytest.approx(recomputed)
    assert report["mode"] == "distributed" and report["delta"] == 1e-5 and rows[0]["noise_std"] == 0.5


def test_a_round_with_fewer_inputs_than_the_noise_shares_assume_is_not_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release needing one input more than the round has (as after a dropout): its sum is never learned, nothing
    is accounted, the model stays."""
    import fedge.coordinator.secure as secure

    monkeypatch.setattr(secure, "release_minimum", lambda devices, *_: len(devices) + 1)
    run_here(overrides("fedavg", 1.0, "simulated", "inline", (*DISTRIBUTED, "run.rounds=2")), tmp_path / "run")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all("not unmasked" in r["secagg_failed"] and r.get("epsilon") is None for r in rows)
    assert not (tmp_path / "run" / "privacy.jsonl").exists() or not read_jsonl(tmp_path / "run" / "privacy.jsonl")
    assert rows[0]["test_accuracy"] == rows[1]["test_accuracy"]  # the model never moved


@pytest.mark.xdist_group("distributed_privacy")
def test_a_run_stops_before_a_round_would_take_epsilon_past_max_epsilon(
        recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each round's accounting depends on its grid alone, so the round that would cross ``privacy.max_epsilon`` is
    known when it opens: it is never opened, the run ends as spent with its last released model, and epsilon stays
    within the budget (the budget set between the 3-round run's second and third epsilon)."""
    epsilons = [line["epsilon"] for line in read_jsonl(recorded.run_dir / "privacy.jsonl")]
    limit = (epsilons[1] + epsilons[2]) / 2  # two rounds fit, the third would not
    sets = overrides("fedavg", 1.0, "simulated", "inline", (*DISTRIBUTED, "run.rounds=3",
                                                             f"privacy.max_epsilon={limit}"))
    report = run_here(sets, tmp_path / "spent", status="budget")
    assert report["status"] == "budget" and report["rounds_completed"] == 2
    assert report["privacy"]["epsilon"] == pytest.approx(epsilons[1]) and report["privacy"]["max_epsilon"] == limit
    assert len(read_jsonl(tmp_path / "spent" / "privacy.jsonl")) == 2  # the third round was never accounted
    assert (tmp_path / "spent" / "model.npz").exists()
    capsys.readouterr()
    assert coordinator(["status", str(tmp_path / "spent")]) == 0  # what an operator sees
    shown = capsys.readouterr().out
    assert f"privacy: epsilon {report['privacy']['epsilon']:.4g} at delta 1e-05 after 2 accounted round(s) " \
           f"(rdp (Skellam), no sampling; stops before {limit})" in shown


@pytest.mark.parametrize(("sets", "says"), [
    (["secagg.enabled=false"], "needs secagg.enabled = true"),
    (["privacy.noise_multiplier=0"], "needs privacy.noise_multiplier > 0"),
    (["privacy.target_epsilon=3.0"], "privacy.target_epsilon"),
    (["privacy.max_epsilon=-1"], "max_epsilon be a finite number >= 0"),
    (["privacy.adaptive_clip=true"], "privacy.adaptive_clip"),
    (["privacy.accountant=\"pld\""], "privacy.accountant"),
    (["privacy.mode=\"central\""], "use privacy.mode = \"distributed\""),
    (["privacy.delta=0.5"], "below 1/population"),
    (["privacy.min_reporters=3"], "privacy.min_reporters"),
])
def test_what_distributed_noise_cannot_hold_with_is_refused_in_one_line(sets: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, [*DISTRIBUTED, *sets])
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_device_refuses_to_help_unmask_a_sum_of_fewer_inputs_than_its_noise_assumes() -> None:
    """Enforced where a malicious coordinator cannot skip it: a device answers no unmask request that names fewer
    survivors than the release its noise share was computed for."""
    from fedge import codec
    from fedge.protocol.secure_device import SecureDevice, SecureLayout
    from fedge.secagg.device import Refused
    from fedge.secagg.encoding import task_settings

    grid = NoisyGrid(16, 16, 1.0, 100.0, 50.0, rotation_seed=1, release=5)
    settings = task_settings(grid, 0.6, 50, 3, 0)
    task = codec.decode(codec.encode(codec.Task("r1", 2, "coordinator", secagg=settings)))
    assert isinstance(task, codec.Task) and task.secagg is not None and task.secagg["dp"]["release"] == 5
    device = SecureDevice("r1", "a0", 0, 7, task, SecureLayout((("w", (4, 4)),)))
    assert isinstance(device.grid, NoisyGrid) and device.grid.release == 5 and device.setup.size == 16
    for survivors in (("a0", "a1", "a2", "a3"), ("a0", "a1", "a1", "a1", "a1")):  # a name repeated counts once
        request = codec.SecAggUnmask("r1", 2, "coordinator", attempt=0, survivors=survivors, dropped=())
        with pytest.raises(Refused, match="fewer than the 5 whose noise shares"):
            device.receive(request)
    silent = codec.Task("r1", 2, "coordinator", secagg=task_settings(
        NoisyGrid(16, 16, 1.0, 100.0, 0.0, rotation_seed=1, release=5), 0.6, 50, 3, 0))
    with pytest.raises(ValueError, match="asks for no noise"):
        SecureDevice("r1", "a0", 0, 7, silent, SecureLayout((("w", (4, 4)),)))


def test_colluders_cannot_subtract_the_noise_the_accountant_counts(tmp_path: Path) -> None:
    """With privacy.tolerate_colluders = c, each device adds sigma^2 / (r - c): the noise left once c devices
    subtract their own shares is still the central variance the ledger accounts; r - c < 1 stops the session."""
    from fedge.coordinator.distributed import BudgetSpent, SessionNoise
    from fedge.coordinator.rundir import RunDir

    settings = load_config(None, [*DISTRIBUTED, "privacy.tolerate_colluders=2"]).privacy
    noise = SessionNoise(settings, 12, RunDir(tmp_path))
    grid = noise.grid(16, 1000, devices=6, release=5)
    central = (grid.scale * settings.noise_multiplier * settings.clip) ** 2
    assert grid.noise * (grid.release - 2) == pytest.approx(central)  # what two colluders cannot take away
    noise.account(1, grid)
    (line,) = read_jsonl(tmp_path / "privacy.jsonl")
    assert line["variance"] == pytest.approx(central) and line["colluders"] == 2
    with pytest.raises(BudgetSpent, match="tolerate_colluders = 2"):
        noise.grid(16, 1000, devices=6, release=2)
