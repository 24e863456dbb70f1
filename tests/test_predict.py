"""On-device inference: after a session, ``edge-agent predict`` runs each device's committed model with onnxruntime
in a process where torch cannot be imported, and gives the classes torch gives on that device's test split; a device
without its own ONNX file uses the coordinator's; what pFedLA keeps is its trained model. The session is played in
this process on the simulated fleet (its worker commits what ``predict`` reads beside the weights, as an agent does:
the model spec and hash, the normalisation, the algorithm); a prediction where torch is installed is the command's
``main`` called here, and every prediction without torch is a process of its own, since that is the claim."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedge.client.state import DeviceState
from fedge.edge_agent.cli import main as edge_agent
from fedge.fldata import normalize, read_shard
from fedge.models import ModelSpec, arrays_to_state, build
from tests.simfleet import InProcessSessions

NO_TORCH = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['edge-agent', *sys.argv[1:]]; "
            "runpy.run_module('fedge.edge_agent', run_name='__main__')")
NO_EXPORT_EXTRA = NO_TORCH.replace("sys.modules['torch']", "sys.modules['onnxscript']")  # torch, but no onnxscript
SMALL = ["run.rounds=2", "fleet.local_agents=2", "run.seed=3", "data.train_limit=200", "fleet.mode=simulated",
         "fleet.backend=inline"]


def predict_without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", NO_TORCH, "predict", *args], capture_output=True, text=True,
                          timeout=120)


def predict_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``edge-agent predict ARGS`` in this process (torch and the export extra installed): exit status, stdout,
    stderr."""
    capsys.readouterr()
    code = edge_agent(["predict", *args])
    said = capsys.readouterr()
    return code, said.out, said.err


def torch_classes(state_dir: Path, samples: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    stored = DeviceState(state_dir).committed_model()
    assert stored is not None
    model = build(ModelSpec.from_dict(stored.model_meta["model"]))
    arrays_to_state(model, stored.model)
    with torch.no_grad():
        return model.eval()(torch.from_numpy(normalize(samples, mean, std))).argmax(dim=1).numpy()


def session(sessions: InProcessSessions, *sets: str) -> Path:
    """A session of two devices and two rounds (exported to model.onnx at its end); its run directory."""
    sessions.run([*SMALL, *sets])
    return sessions.root / "run"


def test_predict_runs_the_committed_model_without_torch(sessions: InProcessSessions, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = session(sessions, "model.name=cnn-bn", "algorithm.name=fedavg")
    report = json.loads((run_dir / "report.json").read_text())
    assert report["onnx_max_abs_difference"] is not None and report["onnx_max_abs_difference"] <= 1e-4
    for index, state_dir in enumerate(sorted((run_dir / "agents").iterdir())):
        shard = read_shard(run_dir / "data" / f"client-{index:03d}.npz")
        samples = tmp_path / f"test-{index}.npy"
        np.save(samples, shard.test_x)
        expected = torch_classes(state_dir, shard.test_x, shard.mean, shard.std)
        assert not (state_dir / "model.onnx").exists()  # the agent never exports: a predicting process does
        if index == 0:  # a device with torch and the export extra: its first prediction exports its model.onnx
            code, _, err = predict_here(capsys, "--state-dir", str(state_dir), "--input", str(samples))
            assert code == 0 and (state_dir / "model.onnx").is_file(), err
            extra = []
        else:  # a device that cannot export: the coordinator's file, this device's weights
            refused = predict_without_torch("--state-dir", str(state_dir), "--input", str(samples))
            assert refused.returncode == 2 and "--onnx" in refused.stderr, refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            agent_profile = subprocess.run([sys.executable, "-c", NO_EXPORT_EXTRA, "predict", "--state-dir",
                                            str(state_dir), "--input", str(samples)], capture_output=True,
                                           text=True, timeout=240)  # torch installed, the export extra not
            assert agent_profile.returncode == 2 and "--onnx" in agent_profile.stderr, agent_profile.stderr
            assert len(agent_profile.stderr.strip().splitlines()) == 1, agent_profile.stderr
            unstamped = tmp_path / "unstamped.onnx"
            unstamped.write_bytes((run_dir / "model.onnx").read_bytes())
            no_stamp = predict_without_torch("--state-dir", str(state_dir), "--input", str(samples), "--onnx",
                                             str(unstamped))
            assert no_stamp.returncode == 2 and "no stamp" in no_stamp.stderr, no_stamp.stderr
            extra = ["--onnx", str(run_dir / "model.onnx")]
        out = predict_without_torch("--state-dir", str(state_dir), "--input", str(samples), "--json", *extra)
        assert out.returncode == 0, out.stderr
        answer = json.loads(out.stdout)
        assert answer["round"] == 2 and answer["algorithm"] == "fedavg" and len(answer["classes"]) == len(expected)
        np.testing.assert_array_equal(np.array(answer["classes"]), expected)
    bad = predict_without_torch("--state-dir", str(tmp_path / "nowhere"), "--input", str(samples))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a state directory" in bad.stderr


def test_pfedla_devices_predict_with_their_trained_model(sessions: InProcessSessions, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = session(sessions, "model.name=mlp", "algorithm.name=pfedla")
    for state_dir in sorted((run_dir / "agents").iterdir()):
        stored = DeviceState(state_dir).committed_model()
        assert stored is not None and stored.round == 2
        assert set(stored.model) == set(stored.arrays)  # pFedLA's device state is its model after training
        for name, value in stored.arrays.items():
            np.testing.assert_array_equal(stored.model[name], value)
        shard = read_shard(run_dir / "data" / f"client-{int(state_dir.name[-2:]):03d}.npz")
        np.save(tmp_path / "test.npy", shard.test_x)
        code, out, err = predict_here(capsys, "--state-dir", str(state_dir), "--input", str(tmp_path / "test.npy"))
        assert code == 0, err
        got = np.array([int(line) for line in out.split()])
        np.testing.assert_array_equal(got, torch_classes(state_dir, shard.test_x, shard.mean, shard.std))
