"""``coordinator replay RUN --data CLIENT_ID=SHARD ...``: play an asynchronous run's dispatch journal through the
simulated fleet, and say whether its final model comes out the same, bit for bit.

Reads the run's config.toml and dispatches.jsonl (refusing, in one line, a run that is not asynchronous, has no
journal, was resumed, or names a client whose shard is not given), builds the session the run had (its checked
plan: model, seed, evaluation, weight cap) over a ``simulation.fleet.ScriptedFleet`` whose logical clients hold the
shards given, with the indices the run gave them, and plays the journal (``coordinator.replay``) into a run
directory of its own (``RUN/replay`` by default), with the records a run writes. Then it compares that model.npz
with the run's. Replaying on the machine the run's devices trained on is what is promised (docs/protocol.md,
"Replay"). Knows no algorithm by name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from fedge import codec
from fedge.coordinator.config import ConfigError, load_config, to_toml
from fedge.coordinator.rundir import RunDir

UNUSED = "(index {} never had a task)"  # a placeholder that holds an index no journal entry names


def add_replay(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    replay = sub.add_parser("replay", help="play an asynchronous run's dispatch journal again through the simulated "
                                           "fleet, and compare its final model with the run's")
    replay.add_argument("run_dir", help="the run to replay (its config.toml and dispatches.jsonl)")
    replay.add_argument("--data", action="append", default=[], metavar="CLIENT_ID=SHARD",
                        help="the shard a device trained on (repeatable; every device the journal names)")
    replay.add_argument("--out", help="the replay's run directory (default RUN/replay; must not hold a run)")
    replay.add_argument("--backend", choices=("inline", "local"), default="inline",
                        help="where the tasks train: this process (default) or a pool of worker processes")
    replay.add_argument("--workers", type=int, default=2, help="the local backend's processes (default 2)")


def read_journal(run: Path) -> list[dict[str, Any]]:
    path = run / "dispatches.jsonl"
    if not path.exists():
        raise ConfigError(f"{run} has no dispatches.jsonl: only an asynchronous session (round.mode = \"async\") "
                          "records its dispatches")
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except ValueError as exc:
                raise ConfigError(f"{path} line {number} is not JSON: {exc}") from None
    return entries


def shard_map(pairs: list[str], clients: dict[int, str]) -> dict[str, str]:
    """CLIENT_ID=SHARD pairs, checked against the clients the journal names."""
    given: dict[str, str] = {}
    for pair in pairs:
        client_id, sep, shard = pair.partition("=")
        if not sep or not client_id or not shard:
            raise ConfigError(f"--data takes CLIENT_ID=SHARD, got {pair!r}")
        if not Path(shard).exists():
            raise ConfigError(f"--data {client_id}: no such shard {shard}")
        given[client_id] = shard
    missing = [client_id for client_id in clients.values() if client_id not in given]
    if missing:
        raise ConfigError(f"the journal names {len(clients)} devices; give each one's shard: --data "
                          f"{missing[0]}=SHARD (missing: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''})")
    return given


def same_models(a: Path, b: Path) -> tuple[bool, str]:
    """Whether two model.npz hold the same arrays bit for bit, and a line saying so."""
    with np.load(a) as left, np.load(b) as right:
        if sorted(left.files) != sorted(right.files):
            return False, f"the models hold different arrays ({len(left.files)} and {len(right.files)})"
        differ = [name for name in left.files if left[name].tobytes() != right[name].tobytes()]
        if not differ:
            return True, f"the final model is the run's, bit for bit ({len(left.files)} arrays)"
        worst = max(float(np.max(np.abs(left[n].astype(np.float64) - right[n].astype(np.float64)))) for n in differ)
        return False, f"{len(differ)} of {len(left.files)} arrays differ (largest |difference| {worst:.3g})"


def command_replay(args: argparse.Namespace) -> int:
    from fedge.client.data import DeviceData
    from fedge.coordinator import asynchronous
    from fedge.coordinator.evaluation import GlobalEvaluator
    from fedge.coordinator.replay import ReplayDiverged, check_journal, play_journal
    from fedge.coordinator.session import Session
    from fedge.plumbing.logsetup import setup_logging
    from fedge.plumbing.threads import one_blas_thread
    from fedge.runtime.launch import finish, hold_run_dir, largest_shard
    from fedge.runtime.plan import plan_session
    from fedge.simulation.backends import make_backend
    from fedge.simulation.fleet import ScriptedFleet
    from fedge.simulation.worker import ClientFiles, WorkerRule

    run = Path(args.run_dir)
    if not (run / "config.toml").exists():
        raise ConfigError(f"{run} is not a run directory (no config.toml)")
    config = load_config(run / "config.toml", [], {})
    if config.round.mode != "async":
        raise ConfigError(f"{run} is a synchronous run: replay plays an asynchronous run's dispatch journal")
    journal = read_journal(run)
    try:
        check_journal(journal, config.run.rounds)
    except ValueError as exc:
        raise ConfigError(f"{run}: {exc}") from None
    clients = {int(e["client"]): str(e["client_id"]) for e in journal if e["event"] == "task"}
    if not clients:
        raise ConfigError(f"{run}: the journal sends no task")
    shards = shard_map(args.data, clients)
    sizes = {}
    for client_id, shard in shards.items():  # every shard read before anything is written
        try:
            sizes[client_id] = len(DeviceData.open(shard).train_y)
        except Exception as exc:
            raise ConfigError(f"--data {client_id}: {shard} is not a shard: {exc}") from None
    # the replay's fleet follows the journal, not a clock: the run's trace and timing play no part
    config = dataclasses.replace(config, fleet=dataclasses.replace(config.fleet, trace="", clock="real",
                                                                   max_seconds=0.0))
    plan = plan_session(config)
    out = Path(args.out) if args.out else run / "replay"
    if (out / "checkpoint.npz").exists():
        raise ConfigError(f"{out} already holds a run: remove it or give --out another directory")
    run_dir = RunDir(out)
    lock = hold_run_dir(run_dir)
    try:
        setup_logging(log_file=str(run_dir / "coordinator.log"), quiet=True)
        one_blas_thread()
        run_dir.write_text("config.toml", to_toml(config))
        capacity = int(journal[0]["clients"])  # the run's session size (ef's keyframe clock counts it)
        if max(clients) >= capacity:
            raise ConfigError(f"{run}: the journal names client {max(clients)} in a session of {capacity}")
        ids = [clients.get(index, UNUSED.format(index)) for index in range(max(clients) + 1)]
        steps = {int(e["task"]): int(e["steps"]) for e in journal if e["event"] == "update"}
        fleet: Any = ScriptedFleet(
            [ClientFiles(cid, shards[cid], str(out / "agents" / cid)) for cid in clients.values()],
            make_backend(args.backend, args.workers, ""), tuple(plan.spec.input_shape), plan.spec.num_classes,
            [sizes[cid] for cid in clients.values()],
            WorkerRule(allow_plugins=tuple(ref.name for ref in plan.plugins.values())),
            budget=lambda _client, task: steps.get(task, 0))
        evaluator = GlobalEvaluator(plan) if plan.dataset is not None and len(plan.dataset.test_y) else None
        session = Session(config, run_dir, fleet, plan.spec, capacity, evaluator, run_id=uuid.uuid4().hex[:12],
                          reserved_ids=ids, initial=plan.initial, welcome_extra=plan.welcome_extra(),
                          weight_cap=largest_shard(plan), privacy=plan.privacy)
        started = time.monotonic()
        try:
            session.save_checkpoint()
            versions = asynchronous.start(session, None)
            session.wait_for_agents(len(clients), 120)  # (this process's own clients: they join on the first poll)
            try:
                received = play_journal(session, versions, journal, fleet)
            except ReplayDiverged as exc:
                print(f"coordinator: the replay diverged from the run at {exc}", file=sys.stderr)
                return 1
            finally:
                versions.finish()
                asynchronous.write_journal(session, versions)
                session.rows.flush()
            session.say_goodbye(codec.vocabulary.BYE_FINISHED, "replay finished", wait_s=5.0)
            finish(session, run_dir, plan.spec, "done", time.monotonic() - started)
        finally:
            fleet.close()
    finally:
        lock.close()
    print(f"replayed {session.round} versions, {received} updates, into {out}/")
    if not (run / "model.npz").exists():
        print(f"{run} has no model.npz to compare with (the run did not finish)")
        return 1
    same, line = same_models(run / "model.npz", out / "model.npz")
    print(line)
    return 0 if same else 1
