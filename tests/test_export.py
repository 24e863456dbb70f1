"""`coordinator export` (meter/export.py): a real short run written to TensorBoard and to an MLflow file
store, then read back (TensorBoard's EventAccumulator, MLflow's client) and compared with the run directory's
own files."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedge.meter.export import (
    TRUNCATED,
    export_mlflow,
    export_tensorboard,
    flatten_config,
    numeric_series,
)
from tests.simfleet import run_here

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SHORT_RUN = ["model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "fleet.local_agents=3",
             "data.train_limit=50", "run.rounds=3", "run.export_onnx=false"]

pytestmark = pytest.mark.xdist_group("export")  # one worker plays the module's run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("export") / "short-run"
    run_here(SHORT_RUN, path)
    return path


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps its file store behind this switch
    return (tmp_path / "mlruns").as_uri()


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]


def expected_series(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """What the export must hold, read here from the file: every int or float field but `round`, per round."""
    found: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "round" and type(value) in (int, float):
                found.setdefault(key, []).append((row["round"], value))
    return found


def toml_leaves(path: Path) -> set[str]:
    """`section.key` of every value of config.toml that is not a table."""
    def walk(table: dict[str, Any], prefix: str) -> set[str]:
        return set().union(*(walk(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
                             for k, v in table.items()))
    return walk(tomllib.loads((path / "config.toml").read_text()), "")


def copy_run(source: Path, target: Path, metrics_text: str) -> Path:
    target.mkdir()
    for name in ("provenance.json", "config.toml", "report.json"):
        shutil.copy(source / name, target / name)
    (target / "metrics.jsonl").write_text(metrics_text)
    return target


def accumulator(path: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def test_the_series_and_the_flattened_configuration_are_what_the_files_hold(run_dir: Path) -> None:
    rows = rows_of(run_dir)
    series = numeric_series(rows)
    assert series == expected_series(rows)
    assert {"test_accuracy", "bytes_up", "wall_s"} <= set(series)
    assert not {"round", "algorithm", "accepted"} & set(series)
    assert set(flatten_config(tomllib.loads((run_dir / "config.toml").read_text()))) == toml_leaves(run_dir)
    table = {"run": {"rounds": 3, "export_onnx": False, "name": "x|y"},
             "data": {"mean": [0.5, 0.25], "sub": {"deep": 1.5, "empty": {}}}, "top": "level"}
    assert flatten_config(table) == {"run.rounds": 3, "run.export_onnx": "false", "run.name": "x|y",
                                     "data.mean": "[0.5, 0.25]", "data.sub.deep": 1.5, "top": "level"}


def test_tensorboard_holds_every_numeric_field_per_round_and_the_configuration(run_dir: Path,
                                                                                tmp_path: Path) -> None:
    target = export_tensorboard(run_dir, tmp_path / "tb")
    assert target == tmp_path / "tb" / run_dir.name
    events = accumulator(target)
    expected = expected_series(rows_of(run_dir))
    assert set(events.Tags()["scalars"]) == set(expected)
    for tag, points in expected.items():
        stored = [(event.step, event.value) for event in events.Scalars(tag)]
        assert stored == [(step, float(np.float32(value))) for step, value in points], tag  # float32 there
    text = events.Tensors("config")[0].tensor_proto.string_val[0].decode()
    keys = {line.split("`")[1] for line in text.splitlines()[2:]}
    assert keys == toml_leaves(run_dir)
    with pytest.raises(FileExistsError, match="already holds TensorBoard events"):
        export_tensorboard(run_dir, tmp_path / "tb")


def test_mlflow_holds_the_params_the_metrics_per_round_and_the_tags(run_dir: Path, mlflow_store: str) -> None:
    from mlflow.tracking import MlflowClient

    run_id = export_mlflow(run_dir, mlflow_store, experiment="export-test")
    client = MlflowClient(tracking_uri=mlflow_store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "export-test"
    config = flatten_config(tomllib.loads((run_dir / "config.toml").read_text()))
    assert run.data.params == {key: str(value) for key, value in config.items()}
    assert set(run.data.params) == toml_leaves(run_dir)
    expected = expected_series(rows_of(run_dir))
    assert set(run.data.metrics) == set(expected)
    for key, points in expected.items():
        history = sorted((metric.step, metric.value) for metric in client.get_metric_history(run_id, key))
        assert history == [(step, float(value)) for step, value in points], key
    provenance = json.loads((run_dir / "provenance.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    tags = run.data.tags
    assert tags["fedge_version"] == provenance["fedge_version"] and tags["status"] == report["status"]
    assert tags.get("git_commit") == provenance["git_commit"] and tags["run_id"] == report["run_id"]
    again = export_mlflow(run_dir, mlflow_store, experiment="export-test")  # a second export, a second run
    assert again != run_id and client.get_run(again).data.params == run.data.params


def test_mlflow_batches_past_its_limits_and_cuts_long_values(run_dir: Path, tmp_path: Path,
                                                            mlflow_store: str) -> None:
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

    rounds = MAX_METRICS_PER_BATCH // 20 + 5
    rows = [{"round": r, **{f"m{i}": r * 0.5 + i for i in range(20)}, "note": "x", "nan": math.nan}
            for r in range(1, rounds + 1)]
    fake = copy_run(run_dir, tmp_path / "wide", "".join(json.dumps(row) + "\n" for row in rows))
    table = {f"k{i}": i for i in range(MAX_PARAMS_TAGS_PER_BATCH + 7)}
    long = "v" * (MAX_PARAM_VAL_LENGTH + 10)
    (fake / "config.toml").write_text("[wide]\n" + "".join(f"{k} = {v}\n" for k, v in table.items())
                                      + f'long = "{long}"\n')
    run_id = export_mlflow(fake, mlflow_store)
    client = MlflowClient(tracking_uri=mlflow_store)
    run = client.get_run(run_id)
    assert len(run.data.params) == len(table) + 1 and run.data.params["wide.k3"] == "3"
    cut = run.data.params["wide.long"]
    assert len(cut) == MAX_PARAM_VAL_LENGTH and cut.endswith(TRUNCATED)
    assert long.startswith(cut[:-len(TRUNCATED)])
    assert run.data.tags["truncated_params"] == "wide.long" and run.data.tags["status"] == "done"
    assert len(client.get_metric_history(run_id, "m19")) == rounds and "note" not in run.data.metrics
    assert [math.isnan(m.value) for m in client.get_metric_history(run_id, "nan")] == [True] * rounds


def test_a_partial_last_line_is_left_out_and_a_broken_earlier_line_is_refused(run_dir: Path,
                                                                              tmp_path: Path) -> None:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    cut = lines[-1][:len(lines[-1]) // 2]  # the round being written
    partial = copy_run(run_dir, tmp_path / "partial", "\n".join(lines[:-1]) + "\n" + cut)
    events = accumulator(export_tensorboard(partial, tmp_path / "tb"))
    rounds = [row["round"] for row in rows_of(run_dir)]
    assert [event.step for event in events.Scalars("test_accuracy")] == rounds[:-1]
    broken = copy_run(run_dir, tmp_path / "broken", "\n".join([lines[0][:10], *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        export_tensorboard(broken, tmp_path / "tb2")


def test_a_directory_that_is_not_a_run_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"round": 1, "x": 1}\n')
    with pytest.raises(FileNotFoundError) as refused:
        export_tensorboard(tmp_path, tmp_path / "tb")
    message = str(refused.value)
    assert "is not a run directory (no provenance.json)" in message and "\n" not in message
    assert not (tmp_path / "tb").exists()


@dataclass
class Said:
    returncode: int
    stdout: str
    stderr: str


def coordinator(capsys: pytest.CaptureFixture[str], *args: str) -> Said:
    """``coordinator ARGS``, its ``main`` called here: its exit code and what it printed."""
    from fedge.runtime.cli import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return Said(code, out, err)


def test_the_command_needs_a_destination_and_prints_one_line_per_destination(
        run_dir: Path, tmp_path: Path, mlflow_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    refused = coordinator(capsys, "export", str(run_dir))
    assert refused.returncode == 2 and "needs a destination" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    tensorboard = tmp_path / "tb"
    done = coordinator(capsys, "export", str(run_dir), "--tensorboard", str(tensorboard),
                       "--mlflow", mlflow_store)
    printed = done.stdout.splitlines()
    assert done.returncode == 0 and len(printed) == 2, done.stderr
    assert str(tensorboard / run_dir.name) in printed[0] and mlflow_store in printed[1]


def test_a_missing_library_is_named_with_its_extra(run_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Each library made unimportable here (``None`` in ``sys.modules``: the exporter imports the top-level
    package first, so its submodules already loaded here do not hide the absence)."""
    for library in ("tensorboard", "mlflow"):
        with monkeypatch.context() as hidden:
            hidden.setitem(sys.modules, library, None)
            said = coordinator(capsys, "export", str(run_dir), f"--{library}", str(tmp_path / library))
        assert said.returncode == 2 and f"pip install 'fedge[{library}]'" in said.stderr, said.stderr
        assert len(said.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "tensorboard").exists()


def test_importing_the_exporter_imports_neither_tensorboard_nor_mlflow() -> None:
    program = ("import sys, fedge.meter.export\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'mlflow')))")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
