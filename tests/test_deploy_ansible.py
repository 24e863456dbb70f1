"""Static checks on deploy/ansible that need no Ansible installed: builtin modules only, every fedge_* variable
defined somewhere, the torch pins readable, the CI script well-formed. deploy/ci-check.sh runs the playbook."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANSIBLE = ROOT / "deploy" / "ansible"
ROLES = ANSIBLE / "roles"
YAML_FILES = sorted([*ANSIBLE.rglob("*.yml")])
TEMPLATES = sorted(ROLES.rglob("*.j2"))

# A task's module key: a dotted collection name at the start of a mapping key, e.g. "  ansible.builtin.copy:".
MODULE_KEY = re.compile(r"^\s*(?:- )?([a-z0-9_]+\.[a-z0-9_]+\.[a-z0-9_]+):", re.M)
# A definition: a top-level or task-level "fedge_x:" key, or register: fedge_x.
DEFINED_KEY = re.compile(r"^\s*(?:- )?(fedge_[a-z0-9_]+):", re.M)
REGISTERED = re.compile(r"register:\s*(fedge_[a-z0-9_]+)")
USED = re.compile(r"\bfedge_[a-z0-9_]+\b")


def test_there_is_something_to_check() -> None:
    assert (ANSIBLE / "site.yml").is_file()
    assert {p.name for p in ROLES.iterdir()} == {"common", "edge_agent", "coordinator"}
    assert len(YAML_FILES) > 10 and len(TEMPLATES) >= 5


def test_only_builtin_modules() -> None:
    for path in YAML_FILES:
        for module in MODULE_KEY.findall(path.read_text()):
            assert module.startswith("ansible.builtin."), f"{path.relative_to(ROOT)} uses {module}"


def test_every_fedge_variable_is_defined() -> None:
    defined: set[str] = set()
    for path in YAML_FILES:
        text = path.read_text()
        defined |= set(DEFINED_KEY.findall(text)) | set(REGISTERED.findall(text))
    defined.add("fedge_ci_root")  # passed by deploy/ci-check.sh with -e
    used: dict[str, str] = {}
    for path in [*YAML_FILES, *TEMPLATES]:
        text = re.sub(r"^\s*#.*$", "", path.read_text(), flags=re.M)
        for name in USED.findall(text):
            used.setdefault(name, str(path.relative_to(ROOT)))
    # Names that are files, groups or units rather than variables.
    not_variables = {"fedge_agents", "fedge_coordinators"}
    missing = {name: where for name, where in used.items() if name not in defined | not_variables}
    assert not missing, f"used but never defined: {missing}"


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_each_architecture_pins_one_torch(arch: str) -> None:
    text = (ROOT / "constraints" / f"cpu-{arch}.txt").read_text()
    pins = re.findall(r"^torch==(\S+)$", text, re.M)
    assert len(pins) == 1, f"constraints/cpu-{arch}.txt must pin torch exactly once"


def test_inventory_example_names_the_groups_the_playbook_targets() -> None:
    inventory = (ANSIBLE / "inventory.example.ini").read_text()
    site = (ANSIBLE / "site.yml").read_text()
    for group in ("fedge_coordinators", "fedge_agents"):
        assert f"hosts: {group}" in site
        assert re.search(rf"^\[{group}(:children)?\]$", inventory, re.M), group


@pytest.mark.parametrize("name", ["ci-check.sh", "systemd-smoke.sh", "aarch64-emulation.sh"])
def test_scripts_are_executable_bash(name: str) -> None:
    script = ROOT / "deploy" / name
    assert script.stat().st_mode & 0o111, f"deploy/{name} must be executable"
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", str(script)], check=True)


def test_ci_tools_are_pinned() -> None:
    lines = [
        line
        for line in (ROOT / "deploy" / "ci-requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==\S+", line) for line in lines), lines
    names = {line.split("==")[0].lower() for line in lines}
    assert {"ansible-core", "ansible-lint"} <= names
