"""scripts/install.sh resolves torch as the README says: the CPU build from PyTorch's CPU index layout, never a CUDA
build, an unreachable index a one-line error within 30 s, and the Jetson pins kept equal to the Ansible role's.

PyTorch's index cannot be reached from here, so the first test builds a file:// simple index (PEP 503) holding
this machine's CPU wheel under the CPU index's layout and points FEDGE_TORCH_INDEX there, with the machine's own
pip configuration (a local wheel folder and extra indexes) bypassed."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIN = next(line for line in (ROOT / "constraints" / "cpu-x86_64.txt").read_text().splitlines()
           if line.startswith("torch=="))


def bypassed_pip_env(**extra: str) -> dict[str, str]:
    """The environment without any of this machine's pip settings (config files and PIP_* variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, **extra}


def local_cpu_wheel(scratch: Path) -> Path:
    """This machine's CPU wheel of the pin where it lies on disk; else a stand-in wheel of the same name and
    version with no dependencies, which still shows where the script resolves torch from (not the CPU build's
    metadata)."""
    version = PIN.split("==", 1)[1]
    for folder in (Path("/opt/wheels"), ROOT / ".whl"):
        for wheel in sorted(folder.glob(f"torch-{version}-*.whl")) if folder.is_dir() else []:
            return wheel
    wheel = scratch / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("torch/__init__.py", "")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: fedge-test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def plan(tmp_path: Path, index: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--plan", str(tmp_path / "plan.json")],
                          cwd=ROOT, env=bypassed_pip_env(FEDGE_TORCH_INDEX=index, FEDGE_PIP_RETRIES="1",
                                                         FEDGE_PIP_TIMEOUT="5"),
                          capture_output=True, text=True, timeout=120)


def test_the_x86_64_pin_is_a_cpu_build() -> None:
    assert PIN.endswith("+cpu"), PIN


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the CPU index and its +cpu pin are x86_64's")
def test_the_plan_from_a_cpu_index_holds_no_cuda_package(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    wheel = local_cpu_wheel(scratch)
    files, simple = tmp_path / "whl" / "cpu" / "files", tmp_path / "whl" / "cpu" / "torch"
    files.mkdir(parents=True)
    simple.mkdir()
    (files / wheel.name).symlink_to(wheel)
    link = f"../files/{wheel.name.replace('+', '%2B')}"
    (simple / "index.html").write_text(f'<!DOCTYPE html><html><body><a href="{link}">{wheel.name}</a></body></html>')
    out = plan(tmp_path, (tmp_path / "whl" / "cpu").as_uri())
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "plan.json").read_text())
    chosen = [(item["metadata"]["name"], item["metadata"]["version"]) for item in report["install"]]
    assert chosen == [("torch", PIN.split("==", 1)[1])], chosen
    requires = report["install"][0]["metadata"].get("requires_dist", [])
    cuda = [r for r in requires if re.match(r"(nvidia-|triton)", r)]
    assert not cuda, cuda  # the CUDA build requires about fifteen nvidia-* packages and triton; the CPU build none
    assert not any("+cu" in version for _, version in chosen)


def test_an_unreachable_index_is_one_line_and_quick(tmp_path: Path) -> None:
    started = time.monotonic()
    out = plan(tmp_path, "https://fedge-torch-index.invalid/whl/cpu")
    elapsed = time.monotonic() - started
    assert out.returncode == 2, out.stdout + out.stderr
    assert elapsed < 30, elapsed
    assert out.stderr.strip().splitlines()[-1].startswith("install.sh: could not resolve torch=="), out.stderr
    assert "FEDGE_TORCH_INDEX" in out.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "plan.json").exists()


def test_an_unknown_option_is_refused() -> None:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--everything"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.strip() == (
        "install.sh: unknown option --everything (use --agent, --dev, --ray, --examples, --flower or --plan FILE)")


def test_the_jetson_pins_are_the_ansible_roles() -> None:
    pins = [line for line in (ROOT / "constraints" / "jetson.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    defaults = (ROOT / "deploy" / "ansible" / "roles" / "common" / "defaults" / "main.yml").read_text()
    block = defaults.split("\nfedge_jetson_constraints:\n", 1)[1]
    role = []
    for line in block.splitlines():
        if not line.startswith("  - "):
            break
        role.append(line[4:].strip())
    assert pins == role and "numpy<2" in pins


def test_secure_aggregation_s_cryptography_is_a_core_dependency_so_every_device_installs_it() -> None:
    """A device installs the core dependencies and the ``agent`` extra (``install.sh --agent``, the Ansible role's
    wheel): secure aggregation's ciphers come from ``cryptography``, which must be among the core ones."""
    import tomllib

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0] for requirement in project["dependencies"]]
    assert "cryptography" in names
