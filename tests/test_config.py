"""Configuration: docs/config.md matches the dataclasses; loading, overrides and errors."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from fedge.coordinator.config import (
    SECTION_CLASSES,
    Config,
    ConfigError,
    load_config,
    parse_override,
    to_toml,
)
from fedge.edge_agent.config import AgentSettings, load_settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
TYPES = {int: "int", float: "float", str: "str", bool: "bool", list: "list", dict: "table"}


def documented() -> dict[str, dict[str, tuple[str, str]]]:
    sections: dict[str, dict[str, tuple[str, str]]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"## \[(\w+)\]", line)
        if heading:
            current = heading.group(1)
            sections[current] = {}
            continue
        if line.startswith("## "):
            current = None
        row = re.match(r"\| (\w+) \| (\w+) \| ([^|]*) \|", line)
        if current and row and row.group(1) != "key":
            sections[current][row.group(1)] = (row.group(2), row.group(3).strip())
    return sections


def test_every_key_is_documented_with_its_type_and_default() -> None:
    docs = documented()
    for name, cls in SECTION_CLASSES.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert set(docs[name]) == set(fields), name
        for key, field in fields.items():
            kind, default = docs[name][key]
            value = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc]
            assert kind == TYPES[type(value)], f"{name}.{key}"
            assert default == (f'"{value}"' if isinstance(value, str) else str(value)), f"{name}.{key}"
    assert set(docs["algorithm"]) == {"name"}


def test_defaults_are_the_embedded_session() -> None:
    config = load_config()
    assert (config.run.rounds, config.fleet.local_agents, config.data.dataset, config.data.partition,
            config.data.alpha, config.train.epochs, config.train.batch_size) == (
        50, 10, "fmnist-demo", "dirichlet", 0.3, 1, 64)
    assert config.algorithm == {"name": "ef-fedprox", "keep": 0.3, "value_dtype": "ternary", "mu": 0.01}
    assert load_config(None, ["algorithm.mu=0.1"]).algorithm == {**config.algorithm, "mu": 0.1}
    assert load_config(None, [], {"algorithm.name": "fedavg"}).algorithm == {"name": "fedavg"}


def test_file_flags_and_overrides_apply_in_order(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[run]\nrounds = 7\n[algorithm]\nname = "fedprox"\nmu = 0.1\n[train]\nlr = 0.01\n')
    config = load_config(path, ["algorithm.mu=0.5", "data.partition=iid", "train.lr=1e-2"], {"run.rounds": 9})
    assert config.run.rounds == 9
    assert config.algorithm == {"name": "fedprox", "mu": 0.5}
    assert config.data.partition == "iid" and config.train.lr == 0.01
    again = load_config(_write(tmp_path / "back.toml", to_toml(config)))
    assert again == config


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(("override", "message"), [
    ("train.bogus=1", "unknown key"), ("bogus.x=1", "unknown section"), ("train.epochs=1.5", "integer"),
    ("round.fraction=0", "fraction"), ("security.curve=maybe", "curve"), ("run.rounds=0", "rounds"),
])
def test_bad_values_are_refused_with_the_key_named(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_set_values_are_toml_literals_or_strings() -> None:
    assert parse_override("a.b=0.5") == ("a", "b", 0.5)
    assert parse_override("a.b=true") == ("a", "b", True)
    assert parse_override("a.b=[1, 2]") == ("a", "b", [1, 2])
    assert parse_override("a.b=dirichlet") == ("a", "b", "dirichlet")
    with pytest.raises(ConfigError):
        parse_override("novalue")


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().run.rounds = 3  # type: ignore[misc]


def test_agent_settings_from_file_and_flags(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.toml", '[agent]\ncoordinator = "tcp://127.0.0.1:1"\nclient_id = "pi-01"\n'
                  'data = "/x.npz"\n[security]\ncurve = "off"\n')
    settings = load_settings(str(path), {"device": "cpu"})
    assert settings == AgentSettings(coordinator="tcp://127.0.0.1:1", client_id="pi-01", data="/x.npz",
                                     device="cpu", state_dir=settings.state_dir)
    with pytest.raises(ValueError, match="unknown key"):
        load_settings(str(_write(tmp_path / "b.toml", "[agent]\nfoo = 1\n")), {})
    with pytest.raises(ValueError, match="keys_dir"):
        load_settings(None, {"coordinator": "tcp://x:1", "client_id": "a", "data": "d", "curve": "on"})
