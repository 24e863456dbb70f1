"""The agent's settings: where the coordinator is, who this device is, where its data and state live, its keys.

Read from a TOML file (``[agent]``, ``[data]``, ``[security]`` and ``[availability]``, the rules of
``edge_agent.availability``; unknown keys are an error) and overridden by command-line flags. ``agent.data`` is a shard path or a data callable ``package.module:callable``;
``agent.allow_plugins`` lists the plugin names the coordinator's welcome may name that this device will import. Must not import torch, transports or algorithms.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from fedge.edge_agent.availability import Rules

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class AgentSettings:
    coordinator: str = ""
    client_id: str = ""
    data: str = ""
    state_dir: str = ""
    device: str = "auto"
    curve: str = "off"
    keys_dir: str = ""
    coordinator_public_key: str = ""
    hello_interval_s: float = 3.0
    energy: str = "auto"
    allow_plugins: tuple[str, ...] = ()
    allow_plugin_mismatch: bool = False
    data_refresh: str = "once"
    after_session: str = "wait"  # wait for the next session, or exit when one finishes
    keep_sessions: int = 3       # device states kept: this session's and the most recent earlier ones
    step_delay_s: float = 0.0    # emulate a slower board: wait this long before each training step
    max_steps: int = 0           # this device's work budget a round: at most this many steps (0: no limit)
    max_seconds: float = 0.0     # ... and training ends after this long (0: no limit); a partial update is sent
    availability: Rules = field(default_factory=Rules)  # when this device may train ([availability])

    def validate(self) -> None:
        if not self.coordinator:
            raise ValueError("agent.coordinator is required (e.g. tcp://192.0.2.10:5555)")
        if not self.client_id or any(c.isspace() for c in self.client_id) or len(self.client_id) > 64:
            raise ValueError("agent.client_id is required: up to 64 characters, no spaces")
        if not self.data:
            raise ValueError("agent.data is required: the path of this device's shard (.npz)")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError("agent.device must be auto, cpu or cuda")
        if self.data_refresh not in ("once", "every-task"):
            raise ValueError(f"data.refresh must be once or every-task, got {self.data_refresh!r}")
        if not isinstance(self.allow_plugins, tuple) or not all(isinstance(n, str) for n in self.allow_plugins):
            raise ValueError("agent.allow_plugins must be a list of plugin names")
        if not isinstance(self.allow_plugin_mismatch, bool):
            raise ValueError("agent.allow_plugin_mismatch must be true or false")
        if isinstance(self.keep_sessions, bool) or not isinstance(self.keep_sessions, int) or self.keep_sessions < 1:
            raise ValueError(f"agent.keep_sessions must be an integer >= 1, got {self.keep_sessions!r}")
        if isinstance(self.step_delay_s, bool) or not isinstance(self.step_delay_s, (int, float)) or \
                not 0 <= self.step_delay_s <= 60:
            raise ValueError(f"agent.step_delay_s must be a number of seconds in [0, 60], got {self.step_delay_s!r}")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 0:
            raise ValueError(f"agent.max_steps must be an integer >= 0 (0: no limit), got {self.max_steps!r}")
        if isinstance(self.max_seconds, bool) or not isinstance(self.max_seconds, (int, float)) or self.max_seconds < 0:
            raise ValueError(f"agent.max_seconds must be a number >= 0 (0: no limit), got {self.max_seconds!r}")
        if self.after_session not in ("wait", "exit"):
            raise ValueError(f"agent.after_session must be wait or exit, got {self.after_session!r}")
        if self.curve not in ("on", "off"):
            raise ValueError("security.curve must be on or off")
        if self.curve == "on" and not (self.keys_dir and self.coordinator_public_key):
            raise ValueError("with security.curve = on, set security.keys_dir and security.coordinator_public_key")


AGENT_KEYS = {"coordinator", "client_id", "data", "state_dir", "device", "hello_interval_s", "energy",
              "allow_plugins", "allow_plugin_mismatch", "after_session", "keep_sessions", "step_delay_s", "max_steps", "max_seconds"}
DATA_KEYS = {"refresh"}
SECURITY_KEYS = {"curve", "keys_dir", "coordinator_public_key"}


def load_settings(path: str | None, overrides: dict[str, Any], extra_plugins: list[str] | None = None) -> AgentSettings:
    values: dict[str, Any] = {}
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ValueError(f"config file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path} is not valid TOML: {exc}") from exc
        unknown_sections = set(raw) - {"agent", "data", "security", "availability"}
        if unknown_sections:
            raise ValueError(f"unknown section(s) {sorted(unknown_sections)} in {path}; known: agent, data, security, "
                             "availability")
        if "availability" in raw:
            values["availability"] = Rules.from_table(dict(raw["availability"]))
        for section, allowed in (("agent", AGENT_KEYS), ("data", DATA_KEYS), ("security", SECURITY_KEYS)):
            table = raw.get(section, {})
            bad = set(table) - allowed
            if bad:
                raise ValueError(f"unknown key(s) {sorted(bad)} in [{section}] of {path}; known: {sorted(allowed)}")
            values.update({f"data_{k}" if section == "data" else k: v for k, v in table.items()})
    values.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(values.get("allow_plugins", []), list):
        values["allow_plugins"] = tuple([*values.get("allow_plugins", []), *(extra_plugins or [])])
    known = {f.name for f in fields(AgentSettings)}
    settings = replace(AgentSettings(), **{k: v for k, v in values.items() if k in known})
    if not settings.state_dir:
        settings = replace(settings, state_dir=str(Path.home() / ".local/state/fedge-agent" / settings.client_id))
    settings.validate()
    return settings
