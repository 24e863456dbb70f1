"""What ``coordinator start`` prints before round 1: a one-line summary of the session, and for a coordinator serving
real devices the few lines an operator needs to connect them (the address with its real port, CurveZMQ, the public-key
file to copy to devices, the allow-list and how many keys it holds), then a "waiting for N agents" line that follows
agents as they join and names the public keys the allow-list refused.

Pure text from the configuration and what the driver passes in; prints through the ``write`` it is given. The full
effective configuration is config.toml in the run directory (``--print-config`` shows it). Must not touch the
session, the transport or the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from fedge.coordinator.config import Config


def summary_line(config: Config, agents: int, local: bool, run_dir: Path) -> str:
    """One line: algorithm, model, data, rounds, fleet, run directory."""
    data = config.data
    partition = data.partition + (f" {data.alpha:g}" if data.partition == "dirichlet" else "")
    if local:
        fleet = f"{'simulated' if config.fleet.mode == 'simulated' else 'local'} fleet of {agents} agents"
    else:
        fleet = f"{config.fleet.expect} device(s) expected at {config.fleet.bind}"
    return (f"{config.algorithm_name} | {config.model.name} on {data.dataset} ({partition}) | "
            f"{config.run.rounds} {'asynchronous versions' if config.round.mode == 'async' else 'rounds'} | {fleet} | run directory {run_dir}/ (config.toml holds the effective "
            "configuration; --print-config shows it)")


def serving_lines(endpoint: str, keys_dir: Path | None) -> list[str]:
    """What an operator connecting devices needs: where, and with which keys."""
    lines = [f"listening on {endpoint} (CurveZMQ {'on' if keys_dir is not None else 'off'})"]
    if keys_dir is None:
        lines.append("  no encryption and no allow-list: any device that can reach this address may join, as any client id: "
                     "device identities are not checked (docs/robustness.md)")
        return lines
    allowed = keys_dir / "allowed"
    held = sorted(allowed.glob("*.key")) if allowed.is_dir() else []
    lines.append(f"  copy the coordinator's public key to every device: {keys_dir / 'coordinator.key'}")
    lines.append(f"  allow-list {allowed}/ holds {len(held)} agent key(s)"
                 + ("" if held else ": put each device's public key there as CLIENT_ID.key, or none can join"))
    return lines


class WaitingLine:
    """The "waiting for N agents (k connected)" line: printed again when the count changes (at most once every
    ``every_s`` seconds, and always once all have joined), plus one line per public key the allow-list refused
    (the device to add to it), once per key."""

    def __init__(self, write: Callable[[str], None], every_s: float = 1.0) -> None:
        self.write = write
        self.every_s = every_s
        self.shown: tuple[int, int] | None = None
        self.shown_at = float("-inf")
        self.refused_seen = 0
        self.named: set[str] = set()

    def __call__(self, now: float, connected: int, expect: int, refused_count: int = 0,
                 refused: Sequence[str] = ()) -> None:
        """``refused_count``: keys refused so far; ``refused``: the last of them (the transport keeps 100)."""
        if (connected, expect) != self.shown and (now - self.shown_at >= self.every_s or connected >= expect):
            self.shown, self.shown_at = (connected, expect), now
            self.write(f"waiting for {expect} agent(s) ({connected} connected)" if connected < expect
                       else f"{connected} agent(s) connected; starting")
        new = min(refused_count - self.refused_seen, len(refused))
        for key in list(refused)[len(refused) - new:] if new > 0 else []:
            if key not in self.named and len(self.named) < 10_000:  # a refused device retries: named once
                self.named.add(key)
                self.write(f"refused a device: its public key {key} is not in the allow-list (add it as "
                           "allowed/CLIENT_ID.key)")
        self.refused_seen = refused_count
