"""What a resume may change: the one allow-list of settings a resumed session (``--resume``, or ``--service`` with a
checkpoint) may set otherwise than its run directory's config.toml, and the check that refuses anything else in one
line, before anything is written.

A run's promises (its privacy budget and mechanism, its robust rule and bounds, its secure aggregation, its
algorithm, model, data and round rules) were fixed when it started; a resume that changed them would keep the
records of one run and the guarantee of another. What a resume may change is how the run is carried out and
watched: how many rounds it runs (``run.rounds``; a calibrated privacy budget is then spread over the rounds left,
``coordinator.privacy.resumed_plan``), evaluation, the final export, and the fleet's transport and timing. Knows no
transport, no algorithm and no file.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedge.coordinator.config import Config, ConfigError

# Each key a resume may change, with why it changes no promise.
RESUMABLE: dict[str, str] = {
    "run.rounds": "how long the run goes on (a calibrated budget is spread over the rounds left)",
    "run.run_dir": "where the run directory is",
    "run.export_onnx": "an export of the final model",
    "eval.every": "how often the coordinator evaluates",
    "eval.personal_every": "how often personal models are evaluated",
    "fleet.bind": "the address the coordinator listens on",
    "fleet.heartbeat_s": "the transport's heartbeats",
    "fleet.liveness_s": "the transport's liveness",
    "fleet.join_timeout_s": "how long the coordinator waits for devices",
    "fleet.agent_python": "the interpreter of local agent processes",
    "fleet.max_uploads": "upload pacing",
    "fleet.backend": "where simulated clients are trained",
    "fleet.workers": "how many workers train simulated clients",
    "fleet.ray_address": "the Ray cluster simulated clients are trained on",
    "round.deadline_s": "how long a round waits",
    "round.target": "how many updates close a round early",
    "round.min_clients": "how few devices a round may start with",
    "security.keys_dir": "where the CurveZMQ keys are kept",
}


def flat(config: Config) -> dict[str, Any]:
    """Every setting of a configuration as ``section.key`` (``algorithm.*`` included)."""
    settings: dict[str, Any] = {}
    for section, values in dataclasses.asdict(config).items():
        for key, value in values.items():
            settings[f"{section}.{key}"] = value
    return settings


def changed(stored: Config, resumed: Config) -> list[str]:
    """The settings whose values differ between the two configurations, sorted."""
    before, after = flat(stored), flat(resumed)
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))


def check_resume(stored: Config, resumed: Config, completed: int) -> None:
    """Refuse, in one line, a resume that changes a setting outside ``RESUMABLE`` or plans fewer rounds than the
    ``completed`` ones."""
    refused = [key for key in changed(stored, resumed) if key not in RESUMABLE]
    if refused:
        before, after = flat(stored), flat(resumed)
        shown = ", ".join(f"{key} ({before.get(key)!r} -> {after.get(key)!r})" for key in refused[:4])
        more = f" and {len(refused) - 4} more" if len(refused) > 4 else ""
        raise ConfigError(f"a resume may not change what the run promised: {shown}{more}; a resume may change only "
                          f"{', '.join(sorted(RESUMABLE))} (start a new run for the rest)")
    if resumed.run.rounds < completed:
        raise ConfigError(f"run.rounds = {resumed.run.rounds} is below the {completed} rounds this run has completed")
