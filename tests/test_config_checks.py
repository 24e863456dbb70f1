"""The whole configuration is checked when it is read: typed algorithm options and [train], one line, nothing
written. ``coordinator start``'s refusals run its ``main`` in this process (they come before it sets up logging or
plays anything); the agent's, which sets up logging first, run in a process of their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedge.coordinator.config import ConfigError, load_config
from fedge.runtime.cli import main as coordinator
from fedge.runtime.plan import plan_session

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("overrides", "message"), [
    (["algorithm.keep=abc"], "algorithm.keep must be a number, got 'abc'"),
    (["algorithm.keep=true"], "algorithm.keep must be a number, got True"),
    (["algorithm.value_dtype=3"], "algorithm.value_dtype must be a string, got 3"),
    (["algorithm.name=dssa-fedprox", "algorithm.warmup_rounds=1.5"], "algorithm.warmup_rounds must be an integer"),
    (["algorithm.name=fedprox", "algorithm.mu=[1]"], "algorithm.mu must be a number, got [1]"),
    (["train.optimizer=rmsprop"], "train.optimizer must be one of"),
    (["train.lr=0"], "train.lr > 0"),
    (["algorithm.name=nope"], "unknown algorithm 'nope'"),
    (["fleet.mode=threads"], "fleet.mode must be one of process, simulated, got 'threads'"),
    (["fleet.mode=simulated", "fleet.backend=dask"], "fleet.backend must be one of inline, local, ray"),
    (["fleet.mode=simulated", "fleet.workers=-1"], "fleet.workers must be >= 0"),
    (["fleet.mode=simulated", "fleet.bind=tcp://127.0.0.1:5555"], "takes no fleet.bind"),
    (["fleet.ray_address=10.0.0.1:6379"], "fleet.ray_address is for fleet.backend = \"ray\""),
    (["data.clients=40"], "data.clients (40) != agents (2); for more clients than processes use fleet.mode"),
    (["round.count=2", "round.target=3"], "round.target (3) cannot exceed round.count (2)"),
    (["round.target=-1"], "round.target must be >= 0"),
    (["round.policy=fastest"], "round.policy must be one of uniform, latency, got 'fastest'"),
    (["round.mode=later"], "round.mode must be one of sync, async, got 'later'"),
    (["fleet.clock=fast"], "fleet.clock must be one of real, simulated, got 'fast'"),
    (["fleet.clock=simulated"], "fleet.clock = \"simulated\" times a simulated fleet's tasks"),
    (["fleet.mode=simulated", "fleet.clock=simulated", "fleet.speeds=fast"], "[fleet] speeds must be one of"),
    (["fleet.mode=simulated", "fleet.clock=simulated", "fleet.step_s=0"], "[fleet] the simulated step time"),
    (["fleet.mode=simulated", "fleet.max_seconds=5"], "fleet.max_seconds and fleet.trace count simulated seconds"),
    (["fleet.mode=simulated", "fleet.clock=simulated", "fleet.max_seconds=-1"], "max_seconds must be finite and >= 0"),
    (["fleet.mode=simulated", "fleet.clock=simulated", "fleet.max_seconds=inf"], "max_seconds must be finite"),
    (["fleet.mode=simulated", "fleet.clock=simulated", "fleet.speed_sigma=50"], "speed_sigma and jitter_sigma must"),
    (["fleet.mode=simulated", "fleet.clock=simulated", "fleet.trace=/nonexistent/trace.csv"],
     "fleet.trace: cannot read /nonexistent/trace.csv"),
    (["round.mode=async", "algorithm.name=scaffold"], "round.mode = \"async\" runs fedavg, fedprox, ef-fedavg, "
                                                      "ef-fedprox, not 'scaffold'"),
    (["round.mode=async", "algorithm.name=fedavg", "algorithm.upload=model"], "needs algorithm.upload = \"delta\""),
    (["round.mode=async", "algorithm.name=fedavg", "asynchronous.buffer=0"], "asynchronous.concurrency and "
                                                                             "asynchronous.buffer must be >= 1"),
    (["round.mode=async", "algorithm.name=fedavg", "asynchronous.staleness=linear"], "asynchronous.staleness must"),
    (["round.mode=async", "algorithm.name=fedavg", "round.target=2"], "does not take round.target"),
    (["round.mode=async", "algorithm.name=fedprox", "round.policy=latency"], "does not take round.policy"),
    (["round.mode=async", "algorithm.name=fedavg", "robust.aggregator=median"], "does not take robust.aggregator"),
    (["round.mode=async", "algorithm.name=fedavg", "secagg.enabled=true"], "does not take secure aggregation"),
    (["round.mode=async", "algorithm.name=fedavg", "fleet.max_uploads=4"], "does not take fleet.max_uploads"),
    (["round.mode=async", "algorithm.name=ef-fedavg", "asynchronous.buffer=3"],
     "ef-fedavg's devices keep state, so each holds at most one uncommitted update and a version of "
     "asynchronous.buffer = 3 updates needs 3 devices; the fleet has 2"),
])
def test_bad_options_are_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_session(load_config(None, ["fleet.local_agents=2", *overrides]))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_async_rounds_upload_deltas_and_take_the_asynchronous_section() -> None:
    config = load_config(None, ["round.mode=async", "algorithm.name=fedprox", "asynchronous.buffer=3",
                                "asynchronous.normalize=weight"])
    assert config.algorithm["upload"] == "delta"
    settings = config.asynchronous.settings()
    assert (settings.buffer, settings.normalize, settings.concurrency) == (3, "weight", 10)
    assert "upload" not in load_config(None, ["algorithm.name=fedavg"]).algorithm  # sync keeps the model upload


def test_an_integer_is_a_valid_float_option() -> None:
    plan = plan_session(load_config(None, ["fleet.local_agents=2", "algorithm.keep=1"]))
    assert plan.config.algorithm["keep"] == 1


def test_the_cli_refuses_a_typed_option_before_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code = coordinator(["start", "--run-dir", str(run_dir), "--set", "algorithm.keep=abc", "--quiet"])
    said = capsys.readouterr()
    assert code == 2 and not run_dir.exists() and said.out == ""
    assert said.err.strip() == "coordinator: error: [algorithm] ef-fedprox: algorithm.keep must be a number, got 'abc'"


def test_exit_codes_say_configuration_or_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)

    code = coordinator(["start", "--run-dir", str(tmp_path / "r"), "--set", "data.dataset=npz",
                        "--set", f"data.path={tmp_path / 'none'}", "--quiet"])
    said = capsys.readouterr().err
    assert code == 3 and said.startswith("coordinator: data error: ") and said.count("\n") == 1, said
    assert not (tmp_path / "r").exists()
    (tmp_path / "bad.npz").write_bytes(b"not a shard")
    agent = run("fedge.edge_agent", "run", "--coordinator", "tcp://127.0.0.1:9", "--client-id", "pi", "--data",
                str(tmp_path / "bad.npz"), "--state-dir", str(tmp_path / "state"))
    assert agent.returncode == 3 and agent.stderr.startswith("edge-agent: data error: ") and \
        agent.stderr.count("\n") == 1, agent.stderr
    assert not (tmp_path / "state").exists(), "refused before anything was written"
    config = run("fedge.edge_agent", "run", "--coordinator", "tcp://127.0.0.1:9", "--client-id", "has space",
                 "--data", str(tmp_path / "bad.npz"))
    assert config.returncode == 2 and config.stderr.count("\n") == 1, config.stderr


def test_settings_that_do_not_fit_a_welcome_are_refused_when_the_session_is_planned() -> None:
    import dataclasses

    from fedge.coordinator.config import ConfigError, from_dict
    from fedge.runtime.plan import check_welcome, plan_session

    plan = plan_session(from_dict({"data": {"dataset": "fmnist-demo"}, "fleet": {"local_agents": 2}}))
    check_welcome(plan)  # the real session's settings fit
    too_many = dataclasses.replace(plan, mean=tuple(0.5 for _ in range(2000)), std=tuple(1.0 for _ in range(2000)))
    with pytest.raises(ConfigError, match="do not fit the welcome.*at most 1024 items"):
        check_welcome(too_many)


def test_a_simulated_fleet_holds_more_clients_than_agents() -> None:
    plan = plan_session(load_config(None, ["fleet.local_agents=2", "fleet.mode=simulated", "data.clients=40",
                                           "data.partition=iid"]))
    assert len(plan.shards) == 40


def test_the_ray_backend_without_ray_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray cannot be imported here
    run_dir = tmp_path / "run"
    code = coordinator(["start", "--set", "fleet.mode=simulated", "--set", "fleet.backend=ray", "--run-dir",
                        str(run_dir)])
    said = capsys.readouterr()
    assert code == 2, said
    assert "needs Ray on this machine" in said.err and len(said.err.strip().splitlines()) == 1
    assert not run_dir.exists()


def test_a_bad_device_trace_is_refused_in_one_line_naming_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("client,speed,from_s,until_s\n0,1.5,,\n9,,0,10\n")
    with pytest.raises(ConfigError) as info:
        plan_session(load_config(None, ["fleet.mode=simulated", "fleet.clock=simulated", "data.clients=4",
                                        f"fleet.trace={trace}"]))
    assert str(info.value) == f"fleet.trace {trace}: trace line 3: client 9 is not one of the fleet's 4 (0 to 3)"
