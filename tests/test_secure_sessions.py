"""Secure aggregation in whole sessions (``[secagg]``): the model moves by exactly the survivors' quantised mean
change, a simulated fleet equals a fleet of agent processes bit for bit, what the guarantee cannot hold with is
refused in one line before anything is written, and a coordinator that crashed after unmasking a round's sum
redoes the round with devices that refuse to mask a second input of it."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedge import codec
from fedge.coordinator import crashpoints
from fedge.coordinator.config import ConfigError, load_config
from fedge.protocol.agent import AgentProtocol, DeviceFacts
from fedge.protocol.events import Send
from fedge.secagg import field
from fedge.secagg.encoding import Grid, grid_for, task_settings
from tests.e2e import Processes, finished
from tests.simfleet import differences, overrides, read_jsonl, records, resume_here, run_here

SECURE = ("algorithm.name=fedavg", "secagg.enabled=true")


@pytest.mark.parametrize("algorithm", ["fedavg", "dssa-fedprox", "ef-shared-fedprox"])
def test_the_model_moves_by_exactly_the_survivors_quantised_mean(algorithm: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every device's field words are recorded as the shipped grid encodes them (before masking); the change the
    coordinator folds is their sum, read back as the grid's mean, bit for bit, and never one device's. DSSA (one
    warm-up round): its sparse round masks the dense tensors and the complement of the round's mask, half the
    words of its dense round; ef-shared masks the round's published support."""
    from fedge.protocol.server_half import Aggregation

    encoded: list[tuple[Grid, np.ndarray]] = []
    folded: list[np.ndarray] = []
    encode, fold = Grid.encode, Aggregation.fold_secure_mean

    def recording_encode(self: Grid, change: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        words = encode(self, change, rng)
        encoded.append((self, words.copy()))
        return words

    def recording_fold(self: Aggregation, groups: dict[str, codec.TensorGroup], contributor: tuple[str, int],
                       contributors: list[int]) -> None:
        (group,) = groups.values()
        pieces = [np.asarray(value).ravel() for value in group.dense.values()]
        folded.append(np.concatenate(pieces + ([group.sparse.values] if group.sparse is not None else [])))
        fold(self, groups, contributor, contributors)

    monkeypatch.setattr(Grid, "encode", recording_encode)
    monkeypatch.setattr(Aggregation, "fold_secure_mean", recording_fold)
    extra = ("algorithm.warmup_rounds=1",) if algorithm.startswith("dssa") else ()
    run_here(overrides(algorithm, 1.0, "simulated", "inline", (*SECURE, f"algorithm.name={algorithm}", *extra,
                                                                "fleet.local_agents=4", "run.rounds=2")),
             tmp_path / "run")
    assert len(encoded) == 8 and len(folded) == 2
    for number, change in enumerate(folded):
        grid = encoded[4 * number][0]
        total = np.zeros(grid.size, np.uint64)
        for _, words in encoded[4 * number:4 * number + 4]:
            total = field.add(total, words, grid.bits)
        expected = grid.mean(total, 4).astype(np.float32)
        got = change
        assert got.tobytes() == expected.tobytes(), f"round {number + 1}"
        one = grid.mean(encoded[4 * number][1], 1).astype(np.float32)
        assert not np.array_equal(got, one)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [(r["secagg_summed"], r["secagg_failed"], r["secagg_attempt"]) for r in rows] == [(4, "", 0)] * 2
    assert rows[-1]["test_accuracy"] > 0.3
    if extra:  # the sparse round masks the dense tensors and the complement: about half the dense round's words
        assert rows[1]["dssa_sparse"] == 1 and 0.4 < folded[1].size / folded[0].size < 0.6
    if algorithm.startswith("ef-shared"):  # the words of the round's published support alone
        assert [f.size for f in folded] == [r["ef_support"] for r in rows] and rows[0]["ef_dense_resyncs"] == 0
        assert [r["ef_keyframe"] for r in rows] == [1, 1]  # a full round: the mean counts every device it sums


FLEET = "fleet.local_agents=4"  # the bit-for-bit sessions' devices (at least 3: secure aggregation's least)


def check_secure_records(expected: dict[str, Any], run_dir: Path, fleet: str, dssa: bool) -> None:
    """A full-participation secure session's records (four devices, three rounds): every device summed each round,
    and what is computed from a device's data or its change stays on the device."""
    assert [row["reported"] for row in expected["metrics"]] == [4, 4, 4]
    clients = read_jsonl(run_dir / "clients.jsonl")
    assert all(row.get("train_loss") is None and row.get("params_updated") is None
               and row.get("flops_opt_updated") is None for row in clients)
    if fleet == "process":  # (an agent's rows name them; a simulated device's meter has none to name)
        assert all({"train_loss", "params_updated", "flops_opt_updated"} <= row.keys() for row in clients)
    assert all(row["train_loss"] is None for row in expected["metrics"])
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["secagg_summed"] for r in rows] == [4, 4, 4]
    if dssa:
        assert [r["dssa_sparse"] for r in rows] == [0, 1, 1]


def test_a_simulated_fleet_equals_a_fleet_of_agent_processes_bit_for_bit(tmp_path: Path, procs: Processes) -> None:
    """Secure aggregation's one real fleet (`coordinator start`, four agent processes): DSSA with one warm-up round,
    so round 1 masks a dense update (every dense algorithm's path, FedAvg's) and rounds 2 and 3 its sparse
    uplink; the inline fleet plays the same session in this process meanwhile."""
    sets = (*SECURE, "algorithm.name=dssa-fedprox", "algorithm.warmup_rounds=1", FLEET)
    process = procs.cli(overrides("dssa-fedprox", 1.0, "process", extra=sets), tmp_path / "process")
    try:
        run_here(overrides("dssa-fedprox", 1.0, "simulated", "inline", sets), tmp_path / "simulated")
    finally:
        procs.finish(process, "process")
    expected = records(tmp_path / "process")
    assert differences(expected, records(tmp_path / "simulated")) == []
    check_secure_records(expected, tmp_path / "process", "process", dssa=True)


def test_a_secure_fedavg_session_is_the_same_bit_for_bit_on_worker_processes(tmp_path: Path) -> None:
    """FedAvg's secure session on the inline fleet and on worker processes (the local backend): the same records,
    bit for bit (the dense masked round against agent processes: the test above)."""
    sets = (*SECURE, FLEET)
    run_here(overrides("fedavg", 1.0, "simulated", "inline", sets), tmp_path / "inline")
    run_here(overrides("fedavg", 1.0, "simulated", "local", sets), tmp_path / "local")
    expected = records(tmp_path / "inline")
    assert differences(expected, records(tmp_path / "local")) == []
    for run in ("inline", "local"):
        check_secure_records(records(tmp_path / run), tmp_path / run, "simulated", dssa=False)


@pytest.mark.parametrize(("sets", "says"), [
    (["secagg.threshold=0.5"], "secagg.threshold = 0.5"),
    (["secagg.bits=70"], "secagg.bits = 70"),
    (["secagg.clip_range=0"], "secagg.clip_range"),
    (["secagg.stage_timeout_s=-1"], "secagg.stage_timeout_s"),
    (["algorithm.name=\"scaffold\""], "cannot apply to algorithm 'scaffold'"),
    (["algorithm.name=\"ef-fedprox\""], "cannot apply to algorithm 'ef-fedprox'"),
    (["algorithm.name=\"dssa-fedprox\"", "algorithm.uplink_keep=0.3"], "algorithm.uplink_keep < 1"),
    (["fleet.local_agents=2"], "at least 3 devices"),
    (["fleet.mode=\"simulated\"", "data.clients=130", "secagg.bits=8"], "cannot hold the sum of 130 devices"),
    (["fleet.bind=\"tcp://127.0.0.1:0\"", "fleet.expect=2"], "at least 3 devices"),
    (["algorithm.upload=\"model\""], "algorithm.upload"),
    (["algorithm.weighting=\"samples\""], "algorithm.weighting"),
    (["robust.aggregator=\"median\""], "robust.aggregator"),
    (["robust.quarantine_after=2"], "robust.quarantine_after"),
    (["robust.norm_factor=3.0"], "the [robust] bounds"),
    (["fleet.max_uploads=2"], "fleet.max_uploads"),
    (["eval.personal_every=1"], "eval.personal_every"),
    (["privacy.mode=\"central\"", "privacy.noise_multiplier=1.0"], "privacy.mode"),
])
def test_what_secure_aggregation_cannot_hold_with_is_refused_in_one_line(sets: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["algorithm.name=\"fedavg\"", "secagg.enabled=true", *sets])
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_over_selection_waits_for_enough_inputs_for_every_devices_threshold(tmp_path: Path) -> None:
    """Six devices, threshold 0.6: each has k = 5 neighbours and t = 3, so a round needs n - k + t = 4 inputs
    before it may close; ``round.target = 3`` is raised to 4 (at 3, every round failed its neighbourhood check)."""
    run_here(overrides("fedavg", 1.0, "simulated", "inline", (*SECURE, "round.target=3", "run.rounds=2")),
             tmp_path / "run")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [(r["reported"], r["secagg_summed"], r["secagg_failed"]) for r in rows] == [(4, 4, "")] * 2


def test_a_secure_session_is_set_to_deltas_uniform_weights_and_no_bounds() -> None:
    config = load_config(None, ["algorithm.name=\"fedprox\"", "secagg.enabled=true"])
    assert config.algorithm["upload"] == "delta" and config.algorithm["weighting"] == "uniform"
    assert (config.robust.norm_factor, config.robust.max_samples, config.round.min_clients) == (0.0, 0, 3)


def test_the_cli_refuses_a_model_with_integer_buffers_before_it_writes_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedge.runtime.cli import main

    run_dir = tmp_path / "run"
    code = main(["start", "--run-dir", str(run_dir), "--set", "model.name=\"cnn-bn\"",
                 *[a for s in SECURE for a in ("--set", s)]])  # `coordinator start`, as its exit status
    said = capsys.readouterr()
    assert code == 2 and "integer buffers" in said.err, said.err
    assert len(said.err.strip().splitlines()) == 1 and not run_dir.exists()


def secure_task(round_number: int, attempt: int) -> codec.Task:
    model = {"w": np.zeros((3, 4), np.float32)}
    settings = task_settings(grid_for(16, 0.5, [12], 4), 0.6, 50, 2, attempt)
    return codec.Task("r1", round_number, "coordinator", groups={"model": codec.TensorGroup(dense=model)},
                      secagg=settings)


def test_a_device_that_masked_an_input_of_a_round_before_it_restarted_masks_no_other_of_it(tmp_path: Path) -> None:
    """The restart rule across the device's own restart: what ``Masked`` wrote to its state is what its next
    protocol object starts from (``masked_rounds``), for every session it served (one it joined meanwhile does not
    make it forget the first); a task of that round (the next attempt) is reported failed with nothing trained and
    no key sent, and the next round is taken. (tests/test_agent_secure.py checks that a masked update goes out only
    after ``Masked``.)"""
    from fedge.client.state import MASKED_RUNS, DeviceState

    DeviceState(tmp_path).note_masked("r1", 3)
    DeviceState(tmp_path).note_masked("another-run", 8)  # a session it served between the crash and the resume
    agent = AgentProtocol("a0", 3.0, facts=DeviceFacts(fedge_version="0", torch_version="none", dataset_size=10))
    agent.masked_before = DeviceState(tmp_path).masked_rounds()
    agent.joined("r1", 0, 1.0, 60.0, seed=5)
    refused = agent.receive(codec.encode(secure_task(3, attempt=1)), 1.0)
    assert [type(a).__name__ for a in refused] == ["Noted", "Send"] and agent.secure is None
    sent = [a.message for a in refused if isinstance(a, Send)]
    assert isinstance(sent[0], codec.ErrorMessage) and "masked an input of round 3 already" in sent[0].reason
    taken = agent.receive(codec.encode(secure_task(4, attempt=0)), 2.0)
    assert [type(a).__name__ for a in taken] == ["Train", "Send"]  # trained, and its keys go out
    for run in range(MASKED_RUNS + 5):  # a bounded record: the most recent sessions
        DeviceState(tmp_path).note_masked(f"run-{run}", run + 1)
    kept = DeviceState(tmp_path).masked_rounds()
    assert len(kept) == MASKED_RUNS and kept[f"run-{MASKED_RUNS + 4}"] == MASKED_RUNS + 5
    (tmp_path / "masked.json").write_text(json.dumps({"run_id": "r0", "round": 2}))  # the file's first form
    assert DeviceState(tmp_path).masked_rounds() == {"r0": 2}
    (tmp_path / "masked.json").write_text("{")
    with pytest.raises(ValueError, match="masked.json cannot be read"):
        DeviceState(tmp_path).masked_rounds()


SMALL_SECURE = ("model.name=\"mlp\"", "data.train_limit=200", "fleet.local_agents=3", "run.rounds=3",
                "run.export_onnx=false", "fleet.heartbeat_s=0.5", "secagg.stage_timeout_s=20",
                "fleet.mode=\"simulated\"", "fleet.backend=\"inline\"", *SECURE)


def crash(procs: Processes, run_dir: Path, point: str) -> subprocess.Popen[bytes]:
    """`coordinator start` (its fleet inline, in its process) that ends at ``point`` of round 2 (FEDGE_CRASH_AT);
    ``crashed`` waits for it."""
    assert crashpoints.CRASH_AT == ""  # (read at import: this process never crashes)
    return procs.cli(SMALL_SECURE, run_dir, name="crashed", crash_at=f"{point}:2")


def crashed_and_resumed(procs: Processes, process: subprocess.Popen[bytes], run_dir: Path) -> None:
    """The crashed coordinator exited 70 with round 2's secure stage kept; the run is resumed (in this process,
    through the resume rules of `coordinator start --resume`) to its end."""
    assert finished(process, 180) == 70, procs.output("crashed")[-2000:]
    assert json.loads((run_dir / "secagg.json").read_text()) == {"round": 2, "attempt": 0}
    assert resume_here(run_dir)["status"] == "done"
    assert not (run_dir / "secagg-sum.npz").exists()


def test_a_coordinator_that_crashed_while_unmasking_redoes_the_round_and_its_devices_refuse_to_mask_again(
        tmp_path: Path, procs: Processes, caplog: pytest.LogCaptureFixture) -> None:
    """Crash right after round 2's sum was unmasked, before it was kept (crash point ``unmasked``): the resumed
    coordinator opens round 2's next attempt; the three devices (rebuilt from their files, as after a restart) each
    masked an input of round 2 already, so each says so and reports the round failed, the round fails with its
    reason and the model stays as it was, and round 3 is summed as usual."""
    run_dir = tmp_path / "run"
    caplog.set_level(logging.INFO)
    crashed_and_resumed(procs, crash(procs, run_dir, "unmasked"), run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [(r["round"], r["secagg_attempt"], r["secagg_summed"]) for r in rows] == [(1, 0, 3), (2, 1, 0), (3, 0, 3)]
    assert rows[1]["secagg_failed"] and rows[1]["reported"] == 0
    assert rows[1]["test_accuracy"] == rows[0]["test_accuracy"]  # the model stayed as it was
    devices = sorted(path.name for path in (run_dir / "agents").iterdir())
    said = [m for m in caplog.messages if "masked an input of round 2 already" in m]
    assert len(devices) == 3 and len(said) == 6, said
    for device in devices:  # the device's own note, and its report as the coordinator heard it
        assert sum(m.startswith(f"client {device}: round 2: secure aggregation: this device masked") for m in said) \
            == 1, said
        assert sum(m.startswith(f"agent {device} reports round-failed: ") for m in said) == 1, said


def test_a_coordinator_that_crashed_after_unmasking_applies_the_kept_sum_and_ends_as_the_uninterrupted_run(
        tmp_path: Path, procs: Processes) -> None:
    """Crash after round 2's sum was kept and folded, before its checkpoint (crash point ``aggregated``): the
    resumed coordinator does not redo round 2 (a redo would train from the same model, and a second sum of nearly
    the same inputs over other devices would give one device's update away); it applies the kept sum, and the run
    ends with the uninterrupted run's model, bit for bit."""
    run_dir, reference = tmp_path / "run", tmp_path / "reference"
    process = crash(procs, run_dir, "aggregated")
    run_here(SMALL_SECURE, reference)  # meanwhile, the uninterrupted run
    crashed_and_resumed(procs, process, run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [(r["round"], r["secagg_attempt"], r["secagg_summed"]) for r in rows] == [(1, 0, 3), (2, 0, 3), (3, 0, 3)]
    assert [r["secagg_recovered"] for r in rows] == [None, True, None]
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in read_jsonl(reference / "metrics.jsonl")]
    with np.load(reference / "model.npz") as a, np.load(run_dir / "model.npz") as b:
        assert a.files == b.files and all(a[n].tobytes() == b[n].tobytes() for n in a.files if n.startswith("a/"))


def test_a_kept_sum_applies_only_to_its_run_its_round_and_its_layout(tmp_path: Path) -> None:
    """What a resumed coordinator reads back: a sum of another run, or of an earlier round, is removed and not
    applied; one whose layout no longer fits the round (the configuration changed) is refused in one line instead
    of folding a vector laid out otherwise."""
    from fedge.coordinator.rundir import RunDir
    from fedge.coordinator.sections import SecAggSection
    from fedge.coordinator.secure import SUM_FILE, SessionSecAgg, layout_digest
    from fedge.plumbing import save_arrays
    from fedge.protocol.secure_device import SecureLayout

    model = codec.TensorGroup(dense={"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)})
    layout = SecureLayout.of(model)
    secure = SessionSecAgg(SecAggSection(enabled=True), RunDir(tmp_path))

    def kept_file(run_id: str, number: int) -> None:
        save_arrays(tmp_path / SUM_FILE, {"mean": np.arange(9, dtype=np.float64)}, {
            "run_id": run_id, "round": number, "words": 9, "support": layout_digest(layout, 9),
            "contributors": [["a", 0], ["b", 1], ["c", 2]], "record": {"secagg_summed": 3}})

    for run_id, number in (("another-run", 4), ("r1", 3)):
        kept_file(run_id, number)
        assert secure.kept("r1", 4) is None and not (tmp_path / SUM_FILE).exists()
    kept_file("r1", 4)
    kept = secure.kept("r1", 4)
    assert kept is not None and kept.contributors == [("a", 0), ("b", 1), ("c", 2)]
    (group,) = kept.groups({"model": model}).values()
    assert np.array_equal(group.dense["w"].ravel(), np.arange(6)) and np.array_equal(group.dense["b"], [6, 7, 8])
    wider = codec.TensorGroup(dense={"w": np.zeros((3, 3), np.float32)})
    with pytest.raises(ValueError, match="does not fit the round's layout") as refused:
        kept.groups({"model": wider})
    assert "\n" not in str(refused.value)


def test_a_fleet_of_agent_processes_under_curvezmq_sums_the_first_three_and_rebuilds_the_straggler_s_masks(
        tmp_path: Path, procs: Processes) -> None:
    """Four agent processes, CurveZMQ on, over-selection (``round.target = 3``): each round closes on three masked
    inputs; the fourth device, which shared its keys, is cancelled (or its late input refused), so its pairwise
    masks are rebuilt from its neighbours' shares. A wrong rebuild would leave masks on the sum: uniform noise on
    the field, which no model learns from."""
    run_dir = tmp_path / "run"
    procs.run_cli(["model.name=\"mlp\"", "data.train_limit=300", "fleet.local_agents=4", "run.rounds=3",
                   "run.export_onnx=false", "security.curve=on", "round.target=3", *SECURE], run_dir)
    assert json.loads((run_dir / "provenance.json").read_text())["curve"] is True
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [(r["reported"], r["dropped"], r["secagg_summed"], r["secagg_failed"]) for r in rows] == [(3, 1, 3, "")] * 3
    assert rows[-1]["test_accuracy"] > 0.4
