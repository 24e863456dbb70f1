"""The systemd units in deploy/systemd/: in step with the Ansible role templates, and carrying what the service
contract needs (notify + watchdog, restarts, an unprivileged user, state/cache/config directories, hardening)."""

from __future__ import annotations

import importlib.util
import re
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import tools

ROOT = Path(__file__).resolve().parents[1]
SYSTEMD = ROOT / "deploy" / "systemd"
AGENT = "fedge-agent.service"
COORDINATOR = "fedge-coordinator@.service"

Unit = dict[str, list[tuple[str, str]]]


def load_render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fedge_deploy_render", SYSTEMD / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render = load_render()


def parse_unit(text: str) -> Unit:
    """Sections -> (key, value) pairs in order; repeated keys kept, comments and continuations handled."""
    unit: Unit = {}
    section = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.setdefault(section, [])
            continue
        assert section is not None, f"directive outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {line!r}"
        unit[section].append((key.strip(), value.strip()))
    return unit


def values(unit: Unit, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit: Unit, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}= appears {len(found)} times"
    return found[0]


def environment(unit: Unit) -> dict[str, str]:
    pairs = " ".join(values(unit, "Service", "Environment")).split()
    return dict(pair.split("=", 1) for pair in pairs)


def seconds(span: str) -> float:
    """A systemd time span such as 10min, 90s or 1h 30min, in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and "".join(n + u for n, u in parts) == span.replace(" ", ""), f"unparsed time span {span!r}"
    return sum(float(n) * units[u or "s"] for n, u in parts)


@pytest.fixture(scope="module")
def units() -> dict[str, Unit]:
    return {name: parse_unit((SYSTEMD / name).read_text()) for name in (AGENT, COORDINATOR)}


def test_plain_copies_are_rendered_from_the_role_templates() -> None:
    rendered = render.render_all()
    assert set(rendered) == {AGENT, COORDINATOR}
    for name, text in rendered.items():
        assert (SYSTEMD / name).read_text() == text, f"{name} is stale: run python deploy/systemd/render.py"
    assert render.main(["--check"]) == 0


def test_render_check_reports_a_stale_copy(tmp_path: Path) -> None:
    for name, text in render.render_all().items():
        (tmp_path / name).write_text(text)
    assert render.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / AGENT).write_text((tmp_path / AGENT).read_text() + "Nice=5\n")
    assert render.main(["--check", "--out", str(tmp_path)]) == 1


def test_the_prefix_is_filled_in() -> None:
    rendered = render.render_all({"fedge_prefix": "/srv/fedge-venv", "fedge_config_dir": "/srv/etc"})
    agent, coordinator = parse_unit(rendered[AGENT]), parse_unit(rendered[COORDINATOR])
    assert one(agent, "Service", "ExecStart").startswith(
        "/srv/fedge-venv/bin/edge-agent run --config /srv/etc/"
    )
    assert one(coordinator, "Service", "ExecStart").startswith(
        "/srv/fedge-venv/bin/coordinator start --service"
    )
    assert "{{" not in rendered[AGENT] + rendered[COORDINATOR]


def test_defaults_are_read_from_the_roles() -> None:
    defaults = render.role_defaults()
    assert defaults["fedge_prefix"] == "/opt/fedge"
    assert defaults["fedge_user"] == "fedge"
    assert defaults["fedge_config_dir"] == "/etc/fedge"
    assert "fedge_agent_data" not in defaults  # a templated default is not a literal
    for name in SENSOR_ACCESS:
        assert defaults[name] == [], f"{name} must default to an empty list"


def test_agent_command_line(units: dict[str, Unit]) -> None:
    assert (
        one(units[AGENT], "Service", "ExecStart")
        == "/opt/fedge/bin/edge-agent run --config /etc/fedge/agent.toml"
    )


def test_coordinator_template_runs_one_session_per_instance(units: dict[str, Unit]) -> None:
    assert one(units[COORDINATOR], "Service", "ExecStart") == (
        "/opt/fedge/bin/coordinator start --service --config /etc/fedge/coordinator/%i.toml"
        " --run-dir %S/fedge-coordinator/%i"
    )
    assert "%i" in one(units[COORDINATOR], "Unit", "Description")


@pytest.mark.parametrize("name", [AGENT, COORDINATOR])
def test_notify_watchdog_and_restarts(units: dict[str, Unit], name: str) -> None:
    unit = units[name]
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "NotifyAccess") == "main"
    assert seconds(one(unit, "Service", "WatchdogSec")) >= 5 * 60  # above the longest local-training step
    assert one(unit, "Service", "Restart") == "on-failure"
    assert seconds(one(unit, "Service", "RestartSec")) > 0
    # The start limits belong in [Unit]; systemd ignores them in [Service] on current versions.
    assert seconds(one(unit, "Unit", "StartLimitIntervalSec")) > 0
    assert int(one(unit, "Unit", "StartLimitBurst")) >= 1
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert seconds(one(unit, "Service", "TimeoutStopSec")) >= 30
    assert one(unit, "Install", "WantedBy") == "multi-user.target"
    assert "network-online.target" in one(unit, "Unit", "After")


@pytest.mark.parametrize(("name", "state"), [(AGENT, "fedge-agent"), (COORDINATOR, "fedge-coordinator")])
def test_unprivileged_user_and_directories(units: dict[str, Unit], name: str, state: str) -> None:
    unit = units[name]
    assert one(unit, "Service", "User") == "fedge"
    assert one(unit, "Service", "Group") == "fedge"
    assert values(unit, "Service", "DynamicUser") == []  # keys and state outlive the process
    assert one(unit, "Service", "StateDirectory") == state
    assert one(unit, "Service", "CacheDirectory") == state
    assert one(unit, "Service", "ConfigurationDirectory") == "fedge"
    env = environment(unit)
    assert env["HOME"] == f"%S/{state}"
    for key in ("XDG_CACHE_HOME", "MPLCONFIGDIR", "TORCH_HOME"):
        assert env[key].startswith(f"%C/{state}"), f"{key} must be under the CacheDirectory"


HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectHostname": "yes",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
}


@pytest.mark.parametrize("name", [AGENT, COORDINATOR])
def test_hardening(units: dict[str, Unit], name: str) -> None:
    unit = units[name]
    for key, value in HARDENING.items():
        assert one(unit, "Service", key) == value, key
    families = {"AF_UNIX", "AF_INET", "AF_INET6"}
    if name == COORDINATOR:
        families.add("AF_NETLINK")  # libzmq's bind resolves interface names with getifaddrs
    assert set(one(unit, "Service", "RestrictAddressFamilies").split()) == families
    assert one(unit, "Service", "SystemCallFilter") == "@system-service"
    assert values(unit, "Service", "MemoryDenyWriteExecute") == []  # torch emits JIT code


def test_agent_keeps_device_access(units: dict[str, Unit]) -> None:
    agent = units[AGENT]
    assert one(agent, "Service", "SupplementaryGroups") == "video"  # /dev/vcio, Jetson GPU nodes
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert values(agent, "Service", key) == [], f"{key} would cut the agent off its sensors or GPU"


# A Raspberry Pi whose data callable reads an I2C accelerometer and a serial GPS, and a CAN bus.
SENSOR_ACCESS: dict[str, list[str]] = {
    "fedge_agent_read_only_paths": ["/var/log/acme-sensors", "-/run/acme-gps"],
    "fedge_agent_read_write_paths": ["/var/lib/acme-sensors/cursor"],
    "fedge_agent_supplementary_groups": ["i2c", "dialout"],
    "fedge_agent_device_allow": ["/dev/i2c-1 rw", "/dev/vcio rw", "char-ttyUSB rw"],
    "fedge_agent_address_families": ["AF_CAN"],
}
# What each list sets: (section, key) -> the values expected with SENSOR_ACCESS.
SENSOR_DIRECTIVES: dict[str, dict[str, list[str]]] = {
    "fedge_agent_read_only_paths": {"ReadOnlyPaths": ["/var/log/acme-sensors -/run/acme-gps"]},
    "fedge_agent_read_write_paths": {"ReadWritePaths": ["/var/lib/acme-sensors/cursor"]},
    "fedge_agent_supplementary_groups": {"SupplementaryGroups": ["video i2c dialout"]},
    "fedge_agent_device_allow": {
        "DevicePolicy": ["closed"],
        "DeviceAllow": ["/dev/i2c-1 rw", "/dev/vcio rw", "char-ttyUSB rw"],
    },
    "fedge_agent_address_families": {"RestrictAddressFamilies": ["AF_UNIX AF_INET AF_INET6 AF_CAN"]},
}


def service_without(unit: Unit, keys: set[str]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in unit["Service"] if k not in keys]


def test_empty_sensor_lists_leave_the_agent_unit_unchanged() -> None:
    plain = (SYSTEMD / AGENT).read_text()
    assert render.render_all({name: [] for name in SENSOR_ACCESS})[AGENT] == plain
    assert render.render_all()[AGENT] == plain
    agent = parse_unit(plain)
    for key in ("ReadOnlyPaths", "ReadWritePaths", "DevicePolicy", "DeviceAllow"):
        assert values(agent, "Service", key) == [], key


def test_sensor_access_renders_its_directives() -> None:
    default = parse_unit(render.render_all()[AGENT])
    agent = parse_unit(render.render_all(SENSOR_ACCESS)[AGENT])
    touched: set[str] = set()
    for directives in SENSOR_DIRECTIVES.values():
        for key, expected in directives.items():
            assert values(agent, "Service", key) == expected, key
            touched.add(key)
    # Nothing else moves: the rest of [Service], and the other sections, are as without the lists.
    assert service_without(agent, touched) == service_without(default, touched)
    assert {k: v for k, v in agent.items() if k != "Service"} == {
        k: v for k, v in default.items() if k != "Service"
    }
    # A device allow-list, never PrivateDevices=, which would hide the sensor's node.
    assert values(agent, "Service", "PrivateDevices") == []


@pytest.mark.parametrize("name", sorted(SENSOR_ACCESS))
def test_each_sensor_list_sets_only_its_own_directives(name: str) -> None:
    default = parse_unit(render.render_all()[AGENT])
    agent = parse_unit(render.render_all({name: SENSOR_ACCESS[name]})[AGENT])
    expected = SENSOR_DIRECTIVES[name]
    for key, wanted in expected.items():
        assert values(agent, "Service", key) == wanted, key
    assert service_without(agent, set(expected)) == service_without(default, set(expected))


def test_sensor_groups_and_families_are_not_repeated() -> None:
    agent = parse_unit(
        render.render_all(
            {
                "fedge_agent_supplementary_groups": ["video", "i2c"],
                "fedge_agent_address_families": ["AF_INET"],
            }
        )[AGENT]
    )
    assert one(agent, "Service", "SupplementaryGroups") == "video i2c"
    assert one(agent, "Service", "RestrictAddressFamilies") == "AF_UNIX AF_INET AF_INET6"


def test_render_set_takes_a_json_list(tmp_path: Path) -> None:
    setting = 'fedge_agent_device_allow=["/dev/i2c-1 rw"]'
    assert render.main(["--set", setting, "--out", str(tmp_path)]) == 0
    agent = parse_unit((tmp_path / AGENT).read_text())
    assert values(agent, "Service", "DeviceAllow") == ["/dev/i2c-1 rw"]
    assert one(agent, "Service", "DevicePolicy") == "closed"
    assert render.main(["--check", "--set", setting, "--out", str(tmp_path)]) == 0
    assert render.main(["--check", "--out", str(tmp_path)]) == 1  # the default unit has no allow-list
    with pytest.raises(SystemExit):
        render.main(["--set", "fedge_agent_device_allow=[/dev/i2c-1 rw]", "--out", str(tmp_path)])


def test_coordinator_has_no_devices(units: dict[str, Unit]) -> None:
    coordinator = units[COORDINATOR]
    assert one(coordinator, "Service", "PrivateDevices") == "yes"
    assert values(coordinator, "Service", "SupplementaryGroups") == []


def test_systemd_analyze_verify_accepts_both_units(tmp_path: Path) -> None:
    analyze = tools.command("systemd-analyze")
    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    for script in ("edge-agent", "coordinator"):
        path = prefix / "bin" / script
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "units"
    out.mkdir()
    for name, text in render.render_all({"fedge_prefix": str(prefix)}).items():
        (out / name).write_text(text)
    # The agent again, with every sensor list set, as a second agent unit.
    sensors = render.render_all({"fedge_prefix": str(prefix), **SENSOR_ACCESS})[AGENT]
    (out / "fedge-agent-sensors.service").write_text(sensors)
    result = subprocess.run(
        [
            analyze,
            "verify",
            "--man=no",
            "--generators=no",
            str(out / AGENT),
            str(out / COORDINATOR),
            str(out / "fedge-agent-sensors.service"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr
