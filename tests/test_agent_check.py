"""`edge-agent check` against a real CurveZMQ coordinator: ready, unreachable, a wrong coordinator key, a key not in
the allow-list, a key allowed as another client id, a secret key readable by others, an unreadable shard; one line
each, exit 1 on a failure. The coordinator is a process; the checks go through the command's ``main`` in this
process, and one of them runs as the command a user types."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.byom import sensor_shard
from tests.e2e import Processes, endpoint


def keygen(tool: str, keys: Path) -> None:
    from fedge.edge_agent.cli import main as agent_main
    from fedge.runtime.cli import main as coordinator_main

    assert (coordinator_main if tool == "coordinator" else agent_main)(["keygen", "--keys-dir", str(keys)]) == 0


def line(lines: list[str], name: str) -> str:
    return next((item for item in lines if item[5:].startswith(f"{name}:")), f"(no {name} line in {lines})")


def test_edge_agent_check_says_what_would_stop_a_session(procs: Processes, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from fedge.edge_agent.cli import main

    def check(*args: str) -> tuple[int, list[str]]:
        code = main(["check", "--client-id", "dev-0", "--timeout", "3", *args])
        out, err = capsys.readouterr()
        return code, out.splitlines() + err.splitlines()

    server_keys, agent_keys, stranger_keys, other_server = (tmp_path / n for n in ("server", "agent", "stranger",
                                                                                   "other"))
    keygen("coordinator", server_keys)
    keygen("coordinator", other_server)
    keygen("agent", agent_keys)
    keygen("agent", stranger_keys)
    (server_keys / "allowed").mkdir(exist_ok=True)
    shutil.copyfile(agent_keys / "agent.key", server_keys / "allowed" / "dev-0.key")
    capsys.readouterr()  # what keygen said
    run_dir = tmp_path / "run"
    procs.coordinator("--bind", "tcp://127.0.0.1:0", "--expect", "1", "--rounds", "1", "--run-dir", str(run_dir),
                      "--model", "mlp", "--set", "security.curve=\"on\"", "--set", f"security.keys_dir=\"{server_keys}\"",
                      "--quiet")
    address = endpoint(run_dir)
    shard = str(sensor_shard(tmp_path / "shard.npz"))
    curve = ["--coordinator", address, "--curve", "on", "--coordinator-key", str(server_keys / "coordinator.key")]

    code, lines = check(*curve, "--keys-dir", str(agent_keys), "--data", shard)
    assert code == 0, lines
    assert [item.split(":")[0] for item in lines] == ["ok   torch", "ok   energy", "ok   data", "ok   keys",
                                                      "ok   coordinator", "ok   handshake", "ok   protocol",
                                                      "ok   identity"]
    assert "50 training and 10 test samples, 3 classes" in line(lines, "data")
    assert "identity-mismatch: nothing was enrolled" in line(lines, "protocol")
    assert "allows this device's key as client 'dev-0'" in line(lines, "identity")

    out = subprocess.run([sys.executable, "-m", "fedge.edge_agent", "check", "--client-id", "dev-9", "--timeout", "3",
                          *curve, "--keys-dir", str(agent_keys), "--data", shard], capture_output=True, text=True,
                         timeout=120)  # the key is allowed as dev-0: a session would refuse dev-9
    assert out.returncode == 1 and "as client 'dev-0', but its client_id is 'dev-9'" in out.stdout, out.stdout

    code, lines = check("--coordinator", "tcp://127.0.0.1:9", "--data", shard)  # nothing listens on port 9
    assert code == 1 and line(lines, "coordinator").startswith("FAIL coordinator: cannot reach 127.0.0.1:9"), lines

    wrong = [*curve[:4], "--coordinator-key", str(other_server / "coordinator.key")]
    code, lines = check(*wrong, "--keys-dir", str(agent_keys), "--data", shard)
    assert code == 1 and line(lines, "handshake").startswith("FAIL handshake"), lines

    code, lines = check(*curve, "--keys-dir", str(stranger_keys), "--data", shard)
    assert code == 1 and "not in its allow-list" in line(lines, "handshake"), lines

    (agent_keys / "agent.key_secret").chmod(0o644)
    code, lines = check(*curve, "--keys-dir", str(agent_keys), "--data", shard)
    assert code == 1 and "readable by others (mode 0644)" in line(lines, "keys"), lines
    assert not any(item.startswith("ok   handshake") for item in lines)  # no network step with unsafe keys
    (agent_keys / "agent.key_secret").chmod(0o600)

    code, lines = check(*curve, "--keys-dir", str(agent_keys), "--data", str(tmp_path / "missing.npz"))
    assert code == 1 and line(lines, "data").startswith("FAIL data:"), lines
