"""Static checks on deploy/ansible that need no Ansible installed: builtin modules only, every fedge_* variable
defined somewhere, the torch pins readable, the CI script well-formed. deploy/ci-check.sh runs the playbook."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
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


def tasks_of(path: Path) -> list[tuple[str, str, str]]:
    """A task file's top-level tasks in order: (name, module, the task's text)."""
    chunks = re.split(r"^(?=- name: )", path.read_text(), flags=re.M)
    tasks = []
    for chunk in chunks:
        if not chunk.startswith("- name: "):
            continue
        name = chunk.splitlines()[0].removeprefix("- name: ").strip()
        modules = MODULE_KEY.findall(chunk)
        tasks.append((name, modules[0] if modules else "", chunk))
    return tasks


def pip_tasks(path: Path) -> list[tuple[int, str, str]]:
    return [
        (i, name, text)
        for i, (name, module, text) in enumerate(tasks_of(path))
        if module == "ansible.builtin.pip"
    ]


COMMON_TASKS = ROLES / "common" / "tasks" / "main.yml"
CONSTRAINED = "-c {{ fedge_prefix }}/constraints.txt {{ fedge_pip_extra_args }}"


def test_every_pip_install_is_pinned_and_torch_comes_first() -> None:
    installs = [(path, *task) for path in sorted(ROLES.rglob("tasks/*.yml")) for task in pip_tasks(path)]
    assert len(installs) >= 3, "torch, Fedge and the extra packages"
    for path, _, name, text in installs:
        assert CONSTRAINED in " ".join(text.split()), f"{path.relative_to(ROOT)}: {name!r} skips the pins"
    first_path, _, first_name, first_text = installs[0]
    assert first_path == COMMON_TASKS and "fedge_torch_requirement" in first_text, first_name


def test_extra_packages_are_installed_after_torch_and_fedge() -> None:
    tasks = tasks_of(COMMON_TASKS)

    def where(module: str, needle: str) -> int:
        found = [i for i, (_, mod, text) in enumerate(tasks) if mod == module and needle in text]
        assert len(found) == 1, f"one {module} task using {needle}, found {len(found)}"
        return found[0]

    torch = where("ansible.builtin.pip", "fedge_torch_requirement")
    fedge = where("ansible.builtin.pip", "fedge_wheel_file")
    copy = where("ansible.builtin.copy", "fedge_extra_wheels")
    extra = where("ansible.builtin.pip", "fedge_extra_requirements")
    assert torch < fedge < extra, "the extra packages must come after torch and Fedge"
    assert copy < extra, "the wheels must be on the host before pip installs them"
    _, _, text = tasks[extra]
    assert 'virtualenv: "{{ fedge_prefix }}"' in text
    assert "when: fedge_extra_packages | length > 0" in text
    assert "notify: Fedge package changed" in text  # the services restart on a new plugin version
    assert re.search(
        r"^fedge_extra_packages: \[\]$", (ROLES / "common" / "defaults" / "main.yml").read_text(), re.M
    )


def derived_values(path: Path) -> dict[str, str]:
    """A vars file's top-level values, read without a YAML library: "double-quoted" on one line, or >- folded."""
    values: dict[str, str] = {}
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(fedge_[a-z0-9_]+): (.+)$", line)
        if not match:
            continue
        name, text = match.groups()
        if text == ">-":
            folded = []
            for more in lines[i + 1 :]:
                if not more.startswith("  "):
                    break
                folded.append(more.strip())
            values[name] = " ".join(folded)
        else:
            assert text.startswith('"') and text.endswith('"') and "\\" not in text, f"{name}: {text}"
            values[name] = text[1:-1]
    return values


def test_extra_packages_split_into_wheel_copies_and_requirements() -> None:
    """vars/main.yml's expressions, evaluated by Jinja2 with stand-ins for the Ansible filters and tests they use."""
    jinja2 = pytest.importorskip("jinja2")
    derived = derived_values(ROLES / "common" / "vars" / "main.yml")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["basename"] = lambda path: path.rsplit("/", 1)[-1]
    env.filters["regex_replace"] = lambda value, pattern, repl: re.sub(pattern, repl, value)
    env.tests["match"] = lambda value, pattern: re.match(pattern, value) is not None

    def evaluate(name: str, values: Mapping[str, object]) -> object:
        expression = derived[name].strip()
        assert expression.startswith("{{") and expression.endswith("}}")
        return env.compile_expression(expression[2:-2])(**values)

    packages = [
        "/home/op/acme-sensors/dist/acme_sensors-1.2.0-py3-none-any.whl",
        "acme-extra>=1,<2",
        "https://wheels.example/acme_net-0.3-py3-none-any.whl",
    ]
    wheels = evaluate("fedge_extra_wheels", {"fedge_extra_packages": packages})
    assert wheels == packages[:1]
    values = {"fedge_extra_packages": packages, "fedge_extra_wheels": wheels, "fedge_prefix": "/opt/fedge"}
    assert evaluate("fedge_extra_requirements", values) == [
        "/opt/fedge/wheels/acme_sensors-1.2.0-py3-none-any.whl",
        "acme-extra>=1,<2",
        "https://wheels.example/acme_net-0.3-py3-none-any.whl",
    ]
    empty = {"fedge_extra_packages": [], "fedge_extra_wheels": [], "fedge_prefix": "/opt/fedge"}
    assert evaluate("fedge_extra_requirements", empty) == []


def test_every_default_is_explained() -> None:
    """Each fedge_* default sits in a block of lines that opens with a comment, or a comment names it."""
    for path in sorted(ROLES.glob("*/defaults/main.yml")):
        lines = path.read_text().splitlines()
        comments = " ".join(line for line in lines if line.lstrip().startswith("#"))
        for i, line in enumerate(lines):
            match = re.match(r"^(fedge_[a-z0-9_]+):", line)
            if not match:
                continue
            block = []
            for above in reversed(lines[:i]):
                if not above.strip() or above == "---":
                    break
                block.append(above)
            explained = any(above.startswith("#") for above in block) or match.group(1) in comments
            assert explained, f"{path.relative_to(ROOT)}: {match.group(1)} has no comment"


AGENT_TOML = ROLES / "edge_agent" / "templates" / "agent.toml.j2"


def ansible_bool(value: object) -> bool:
    return value is True or str(value).lower() in {"true", "yes", "on", "1", "y"}


def render_agent_toml(**overrides: object) -> str:
    """agent.toml.j2 as Ansible's template module renders it (trim_blocks), with stand-ins for to_json and bool."""
    jinja2 = pytest.importorskip("jinja2")
    import json

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = ansible_bool
    values: dict[str, object] = {
        "fedge_agent_coordinator_address": "tcp://192.0.2.10:5555",
        "fedge_agent_client_id": "pi-01",
        "fedge_agent_data": "/var/lib/fedge-agent/data/shard.npz",
        "fedge_agent_state_dir": "/var/lib/fedge-agent",
        "fedge_agent_device": "cpu",
        "fedge_agent_curve": "on",
        "fedge_agent_keys_dir": "/var/lib/fedge-agent/keys",
        "fedge_config_dir": "/etc/fedge",
        "fedge_agent_allow_plugins": [],
        "fedge_agent_allow_plugin_mismatch": False,
        "fedge_agent_data_refresh": "once",
        "fedge_agent_max_steps": 0,
        "fedge_agent_max_seconds": 0,
    }
    values.update(overrides)
    return env.from_string(AGENT_TOML.read_text()).render(values)


def agent_defaults() -> str:
    return (ROLES / "edge_agent" / "defaults" / "main.yml").read_text()


def test_agent_toml_defaults_write_no_plugin_keys() -> None:
    import tomllib

    defaults = agent_defaults()
    assert re.search(r"^fedge_agent_allow_plugins: \[\]$", defaults, re.M)
    assert re.search(r"^fedge_agent_allow_plugin_mismatch: false$", defaults, re.M)
    assert re.search(r"^fedge_agent_data_refresh: once$", defaults, re.M)
    raw = tomllib.loads(render_agent_toml())
    assert set(raw) == {"agent", "security"}
    assert set(raw["agent"]) == {"coordinator", "client_id", "data", "state_dir", "device"}
    assert raw["agent"]["data"] == "/var/lib/fedge-agent/data/shard.npz"


ALLOWED = ["acme_sensors.models:tiny_cnn", "acme_sensors.imu:recent_windows"]
PLUGINS: dict[str, object] = {
    "fedge_agent_data": "acme_sensors.imu:recent_windows",
    "fedge_agent_allow_plugins": ALLOWED,
    "fedge_agent_allow_plugin_mismatch": True,
    "fedge_agent_data_refresh": "every-task",
}


def test_agent_toml_with_a_users_plugins() -> None:
    import tomllib

    raw = tomllib.loads(render_agent_toml(**PLUGINS))
    assert set(raw) == {"agent", "data", "security"}
    assert raw["agent"]["data"] == "acme_sensors.imu:recent_windows"
    assert raw["agent"]["allow_plugins"] == ALLOWED
    assert raw["agent"]["allow_plugin_mismatch"] is True
    assert raw["data"] == {"refresh": "every-task"}
    assert raw["security"]["curve"] == "on"  # the sections after the new keys are intact


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"fedge_agent_allow_plugins": ["a.b:c"]}, {"agent.allow_plugins": ["a.b:c"]}),
        ({"fedge_agent_allow_plugin_mismatch": "yes"}, {"agent.allow_plugin_mismatch": True}),
        ({"fedge_agent_allow_plugin_mismatch": "false"}, {}),
        ({"fedge_agent_data_refresh": "every-task"}, {"data.refresh": "every-task"}),
        ({"fedge_agent_max_steps": 20, "fedge_agent_max_seconds": 45}, {"agent.max_steps": 20,
                                                                         "agent.max_seconds": 45.0}),
        ({"fedge_agent_allow_plugins": ['odd"name\\x:y']}, {"agent.allow_plugins": ['odd"name\\x:y']}),
    ],
)
def test_agent_toml_writes_each_key_only_when_set(
    overrides: dict[str, object], expected: dict[str, object]
) -> None:
    import tomllib

    def flat(raw: dict[str, dict[str, object]]) -> dict[str, object]:
        return {f"{section}.{key}": value for section, table in raw.items() for key, value in table.items()}

    base = flat(tomllib.loads(render_agent_toml()))
    changed = flat(tomllib.loads(render_agent_toml(**overrides)))
    assert {k: v for k, v in changed.items() if base.get(k, object()) != v} == expected


def test_agent_toml_with_plugins_is_accepted_by_the_agent(tmp_path: Path) -> None:
    config = pytest.importorskip("fedge.edge_agent.config")
    if "allow_plugins" not in getattr(config, "AGENT_KEYS", ()):
        pytest.skip("this checkout's agent does not read allow_plugins yet")
    path = tmp_path / "agent.toml"
    path.write_text(render_agent_toml(**PLUGINS))
    settings = config.load_settings(str(path), {})
    assert settings.data == "acme_sensors.imu:recent_windows"
    assert tuple(settings.allow_plugins) == tuple(ALLOWED)
    assert settings.allow_plugin_mismatch is True
    assert getattr(settings, "data_refresh", "every-task") == "every-task"
