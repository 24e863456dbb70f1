"""Bring your own model and data: the worked example (in this process, on a simulated fleet) and how a local fleet
hands its plugins to agent processes, a bound session whose coordinator has no data with agent processes reading a
data callable, the refusals of the no-remote-code rule, and every one-line error (one of them from the command as a
process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedge import api
from fedge.coordinator.config import ConfigError
from fedge.edge_agent.agent import Refused
from tests.byom import EXAMPLE, FAST, PLUGIN, ROOT, agent, sensor_shard, toml_sets, welcome
from tests.e2e import Processes, finished, metrics, wait_for
from tests.simfleet import InProcessSessions


def test_the_worked_example_runs_as_the_readme_says(sessions: InProcessSessions, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``coordinator start --config examples/tabular/session.toml`` with the example package importable, played in
    this process on a simulated fleet (bit for bit the fleet of agent processes, tests/test_simulated_fleet.py; the
    local fleet's own wiring of a user's plugins: the test after this one)."""
    pytest.importorskip("sklearn", reason="the examples extra (scikit-learn) is part of the dev install")
    monkeypatch.syspath_prepend(str(EXAMPLE))  # as PYTHONPATH=examples/tabular
    from fedge.coordinator.config import load_config

    run_dir = tmp_path / "run"
    readme = toml_sets(EXAMPLE / "session.toml")
    assert load_config(None, readme) == load_config(EXAMPLE / "session.toml")  # the file's session, key for key
    report = sessions.run([*readme, f"run.run_dir={json.dumps(str(run_dir))}", "fleet.mode=simulated",
                           "fleet.backend=inline"])
    rows = metrics(run_dir)
    assert report["status"] == "done" and len(rows) == 3 and report["files"]["onnx"] == "model.onnx"
    assert all(r["eval_source"] == "coordinator" and 0 <= r["test_f1_macro"] <= 1 and r["test_mse"] is None
               for r in rows)
    assert rows[-1]["test_accuracy"] > 0.8, rows[-1]
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert len(clients) == 9 and all("test_accuracy" in c for c in clients)
    from acme_tabular.model import tabular_net

    from tests.plugin_models import tabular_mlp  # a different architecture: load_model must refuse it

    net = api.load_model(run_dir, tabular_net((30,), 2, {"hidden": 32}))
    assert not net.training
    with pytest.raises(ValueError, match="does not fit this module"):
        api.load_model(run_dir, tabular_mlp((30,), 2, {}))


def test_a_local_fleets_agents_allow_the_sessions_plugins_and_import_them_as_the_coordinator_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's command runs the example in agent processes: each is told to allow the session's own plugins
    and gets the coordinator's working directory and ``sys.path``, so that ``acme_tabular`` imports there as here."""
    pytest.importorskip("sklearn", reason="the examples extra (scikit-learn) is part of the dev install")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.chdir(tmp_path)
    from fedge.coordinator.config import load_config
    from fedge.runtime.localfleet import AgentSpec, LocalFleet
    from fedge.runtime.plan import plan_session

    plan = plan_session(load_config(EXAMPLE / "session.toml"))
    fleet = LocalFleet("tcp://127.0.0.1:9", [], allow_plugins=[ref.name for ref in plan.plugins.values()])
    command = fleet.command(AgentSpec("agent-00", tmp_path / "shard.npz", tmp_path / "state"))
    allowed = {command[i + 1] for i, word in enumerate(command) if word == "--allow-plugin"}
    assert allowed == {"acme_tabular.model:tabular_net", "acme_tabular.data:breast_cancer"}
    path = fleet.environment()["PYTHONPATH"].split(os.pathsep)
    assert path[0] == str(tmp_path) and str(EXAMPLE) in path
    probe = subprocess.run([sys.executable, "-c", "import acme_tabular.data"],
                           env=fleet.environment(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr


def test_a_bound_session_whose_coordinator_has_no_data(procs: Processes, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the plugin module lives in tests/
    run_dir = tmp_path / "run"
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "2", "--rounds", "2", "--run-dir", str(run_dir),
        "--model", PLUGIN, "--algorithm", "fedavg", "--set", "data.dataset=\"\"", "--set", "model.input_shape=[3, 32]",
        "--set", "model.outputs=3", "--set", "data.mean=[3.0, 3.0, 3.0]", "--set", "data.std=[1.5, 1.5, 1.5]",
        "--set", "data.clients=2", "--set", "train.lr=0.005", "--set", "security.curve=\"off\"", *FAST)
    address = wait_for(lambda: (run_dir / "endpoint").exists() and (run_dir / "endpoint").read_text().strip(),
                       60, "the endpoint file")
    refusing = procs.agent("--coordinator", address, "--client-id", "pi-new", "--data",
                           "tests.plugin_models:device_windows", "--state-dir", str(tmp_path / "state-new"),
                           name="agent-new")  # its TOML allows no plugin: it must refuse the session's model
    wait_for(lambda: f"plugin-refused: model '{PLUGIN}' is not installed" in procs.output("agent-new"), 120,
             "the refusal")
    assert refusing.poll() is None, "a session-level refusal keeps the agent up (it says hello again later)"
    for i in range(2):
        procs.agent("--coordinator", address, "--client-id", f"pi-{i}", "--data", "tests.plugin_models:device_windows",
                    "--state-dir", str(tmp_path / f"state-{i}"), "--allow-plugin", PLUGIN, name=f"agent-{i}")
    assert finished(coordinator, 180) == 0, procs.output("coordinator") + procs.output("agent-0")
    rows = metrics(run_dir)
    assert [r["eval_source"] for r in rows] == ["agents", "agents"], rows
    assert all(0 <= r["test_accuracy"] <= 1 and r["eval_samples"] == 40 for r in rows)
    assert not (run_dir / "data").exists(), "the coordinator wrote no data of its own"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "done" and report["files"]["model"] == "model.npz"


def test_an_agent_imports_only_what_its_own_toml_allows(tmp_path: Path) -> None:
    sys.modules.pop("tests.plugin_models_unimported", None)
    with pytest.raises(Refused, match="not in agent.allow_plugins") as info:
        agent(tmp_path).join(welcome(model="tests.plugin_models_unimported:net", plugins={}))
    assert info.value.code == "plugin-refused" and "tests.plugin_models_unimported" not in sys.modules
    with pytest.raises(Refused, match="'os:system' is not installed"):
        agent(tmp_path, allow_plugins=(PLUGIN,)).join(welcome(loss="os:system"))
    session = agent(tmp_path, allow_plugins=(PLUGIN,)).join(welcome())
    assert session.welcome.model["name"] == PLUGIN


def test_a_plugin_version_mismatch_is_refused_unless_allowed(tmp_path: Path) -> None:
    other = {"model": {"kind": "model", "name": PLUGIN, "target": PLUGIN, "distribution": "acme-sensors",
                       "version": "2.0"}}
    with pytest.raises(Refused, match="acme-sensors 2.0 on the coordinator") as info:
        agent(tmp_path, allow_plugins=(PLUGIN,)).join(welcome(plugins=other))
    assert info.value.code == "plugin-mismatch"
    agent(tmp_path, allow_plugins=(PLUGIN,), allow_plugin_mismatch=True).join(welcome(plugins=other))


def test_an_entry_point_installed_on_the_device_is_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "site" / "acme_sensors-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-sensors\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[fedge.models]\nsensor-cnn = {PLUGIN}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    from fedge.plugins import allowed, describe

    assert allowed("model", "sensor-cnn", ()) and allowed("model", PLUGIN, ())
    ref = describe("model", "sensor-cnn")
    assert (ref.target, ref.distribution, ref.version) == (PLUGIN, "acme-sensors", "1.0")
    assert not allowed("model", "tests.plugin_models:raises", ())


def test_data_that_does_not_fit_the_session_is_refused(tmp_path: Path) -> None:
    a = agent(tmp_path, allow_plugins=(PLUGIN,))
    with pytest.raises(Refused, match="3 classes; the session's model wants"):
        a.join(welcome(num_classes=4))
    with pytest.raises(Refused, match="takes float32 targets"):
        a.join(welcome(loss="mse"))


def no_run_dir(tmp_path: Path, *args: str, code: int = 2, capsys: pytest.CaptureFixture[str] | None = None) -> str:
    """``coordinator start --run-dir NEVER --quiet ARGS``, which must exit ``code`` with one line on stderr and no
    run directory: as a process, or through the CLI's ``main`` in this process given ``capsys``."""
    run_dir = tmp_path / "never"
    argv = ["start", "--run-dir", str(run_dir), "--quiet", *args]
    if capsys is None:
        out = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", *argv], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        returncode, stdout, stderr = out.returncode, out.stdout, out.stderr
    else:
        from fedge.runtime.cli import main

        returncode = main(argv)
        stdout, stderr = capsys.readouterr()
    assert returncode == code and not run_dir.exists(), stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.name=tests.plugin_models:nothing"], "has no nothing"),
    (["model.name=tests.no_module:f"], "cannot import tests.no_module"),
    (["model.name=not-a-plugin"], "unknown model 'not-a-plugin'"),
    (["model.name=tests.plugin_models:raises"], "needs options.width"),
    (["model.name=tests.plugin_models:not_a_module"], "not a torch.nn.Module"),
    (["model.name=tests.plugin_models:bad_output", "data.dataset=tests.plugin_models:sensor_windows"],
     "outputs (8, 4) for a batch of 8"),
    (["train.loss=mse"], "takes float32 targets"),
    (["train.loss=tests.plugin_models:nothing"], "has no nothing"),
    (["train.loss=tests.plugin_models:raises"], "fails on one batch"),
    (["data.dataset=tests.plugin_models:broken_windows"], "raised OSError: no I2C device at 0x68"),
    ([f"model.name={PLUGIN}", "data.dataset=tests.plugin_models:sensor_windows", "model.input_shape=[3, 33]"],
     "does not match the data's samples"),
    ([f"model.name={PLUGIN}", "data.dataset=tests.plugin_models:sensor_windows", "model.pan=add", "model.pan_t=4.0"],
     "degenerate"),
    (["train.class_weights=[1.0, 2.0]"], "2 values for 10 classes"),
    (["data.min_size=7000"], "need 14000 training samples"),
])
def test_bad_plugins_and_misfits_are_one_line(overrides: list[str], message: str) -> None:
    from fedge.coordinator.config import load_config
    from fedge.runtime.plan import plan_session

    with pytest.raises(ConfigError) as info:
        plan_session(load_config(None, ["fleet.local_agents=2", *overrides]))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_cli_writes_nothing_before_the_plan_passes(tmp_path: Path) -> None:
    """The command as a user runs it (its exit status and stderr); the other one-line errors go through its ``main``."""
    assert "cannot import tests.no_module" in no_run_dir(tmp_path, "--set", "fleet.local_agents=2", "--model",
                                                         "tests.no_module:f")


def test_shards_that_disagree_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    sensor_shard(shards / "a.npz")
    sensor_shard(shards / "b.npz", classes=4)
    line = no_run_dir(tmp_path, "--set", "fleet.local_agents=2", "--model", PLUGIN, "--set", "data.dataset=\"npz\"",
                      "--set", f"data.path=\"{shards}\"", code=3, capsys=capsys)  # a data error
    assert "the shards of one data set must agree" in line


def test_the_api_refuses_a_lambda_for_processes_and_runs_a_registered_model(tmp_path: Path) -> None:
    from tests import plugin_models

    api.register_model("lambda-net", lambda shape, outputs, options: plugin_models.sensor_cnn(shape, outputs, {}))
    api.register_dataset("sensor-windows", plugin_models.sensor_windows)
    config = api.session_config(model={"name": "lambda-net"}, data={"dataset": "sensor-windows"},
                                fleet={"local_agents": 2})
    with pytest.raises(ConfigError, match="which another process cannot import"):
        api.check_session(config)
    assert api.register_model("sensor-net", plugin_models.sensor_cnn) == PLUGIN
    plan = api.check_session(api.session_config(model={"name": "sensor-net"}, data={"dataset": "sensor-windows"},
                                                fleet={"local_agents": 2}))
    assert plan.spec.name == PLUGIN and plan.config.model.name == PLUGIN and len(plan.shards) == 2
    assert np.isclose(plan.mean[0], 3.0, atol=0.2)
    assert api.register_loss("mae", plugin_models.sum_loss) == "tests.plugin_models:sum_loss"
    api.register_dataset("sensor-targets", plugin_models.sensor_targets)
    regression = api.check_session(api.session_config(
        model={"name": "tests.plugin_models:sensor_regressor"}, data={"dataset": "sensor-targets", "partition": "iid"},
        train={"loss": "mae"}, fleet={"local_agents": 2}))
    assert regression.config.train.loss == "tests.plugin_models:sum_loss" and regression.spec.num_outputs == 2
    assert regression.plugins["loss"].target == "tests.plugin_models:sum_loss"
