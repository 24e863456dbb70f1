"""``coordinator start``: turn a configuration into a running session, and finish it.

Checks the whole configuration first (``runtime.plan``: nothing is written before it passes), resolves the run
directory (new, resumed, or service mode), writes the local fleet's shards and keys, binds the transport (CurveZMQ on by default for non-loopback binds), starts the local
agents, plays the session, and writes the final model, its ONNX export and report.json. Ctrl-C or SIGTERM finishes
cleanly: the last completed round is already checkpointed. Knows no algorithm by name.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import math
import resource
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from fedge import codec
from fedge.coordinator.config import Config, ConfigError, load_config, local_clients, to_toml
from fedge.coordinator.rundir import RunDir, save_arrays
from fedge.coordinator.session import Session
from fedge.coordinator.transport import (
    ALLOWED_DIR,
    COORDINATOR_KEY,
    CurveServerKeys,
    RouterTransport,
    generate_keys,
)
from fedge.models import ModelSpec
from fedge.plumbing.keys import AGENT_KEY
from fedge.plumbing.logsetup import setup_logging
from fedge.plumbing.net import is_loopback_host
from fedge.plumbing.threads import one_blas_thread
from fedge.runtime.console import WaitingLine, serving_lines, summary_line
from fedge.runtime.localfleet import AgentSpec, LocalFleet, agent_id
from fedge.runtime.plan import SessionPlan, device_timing, plan_session

NEVER_S = 1e12  # a simulated-clock fleet's heartbeat and liveness: its devices never go quiet (no availability yet)
log = logging.getLogger("fedge.coordinator")

def is_loopback(bind: str) -> bool:
    host = bind.split("://", 1)[-1].rsplit(":", 1)[0]
    return bind.startswith(("ipc://", "inproc://")) or is_loopback_host(host)


def resolve_run(args: argparse.Namespace, flags: dict[str, Any]) -> tuple[SessionPlan, Path, bool]:
    """(checked plan, run directory path, resuming?) from --resume, --service or a fresh start; nothing is written."""
    if args.resume:
        path = Path(args.resume)
        if not (path / "checkpoint.npz").exists():
            raise ConfigError(f"{args.resume} has no checkpoint.npz to resume from")
        extend = {"run.rounds": args.rounds} if args.rounds else {}
        return plan_resume(path, load_config(path / "config.toml", args.set, extend)), path, True
    config = load_config(args.config, args.set, flags)
    if args.service:
        if not config.run.run_dir and not args.run_dir:
            raise ConfigError("--service needs --run-dir or run.run_dir")
        path = Path(args.run_dir or config.run.run_dir)
        if (path / "checkpoint.npz").exists():
            return plan_resume(path, load_config(path / "config.toml", args.set, flags)), path, True
        return plan_session(config), path, False
    plan = plan_session(config)
    path = Path(config.run.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{config.algorithm_name}")
    if (path / "checkpoint.npz").exists():
        raise ConfigError(f"{path} already holds a run: use --resume {path} or another --run-dir")
    return plan, path, False


def plan_resume(path: Path, config: Config) -> SessionPlan:
    """A resumed session's checked plan: only what ``coordinator.resume_rules`` allows may differ from the run's
    config.toml, and a private run's noise is planned from its ledger (``coordinator.privacy.resumed_plan``);
    refused in one line before anything is written."""
    from fedge.coordinator.resume_rules import check_resume
    from fedge.plumbing.files import load_meta

    completed = int(load_meta(path / "checkpoint.npz").get("round", 0))
    check_resume(load_config(path / "config.toml"), config, completed)
    if config.privacy.mode != "central":
        return plan_session(config)
    from fedge.coordinator.privacy import read_ledger

    return plan_session(config, spent=read_ledger(RunDir(path)), completed=completed)


def hold_run_dir(run_dir: RunDir) -> Any:
    """One coordinator per run directory: ConfigError naming the process that holds it."""
    from fedge.plumbing import DirectoryLocked, hold_directory

    try:
        return hold_directory(run_dir.path, "coordinator")
    except DirectoryLocked as exc:
        raise ConfigError(str(exc)) from None


def prepare_local_fleet(plan: SessionPlan, run_dir: RunDir) -> list[AgentSpec]:
    """Write one shard per agent (once; a resumed run reuses them) and return the agents to start."""
    from fedge.fldata import write_shard

    config = plan.config
    count = local_clients(config)
    data_dir = run_dir.path / "data"
    shards = [data_dir / f"client-{i:03d}.npz" for i in range(count)]
    if not all(s.exists() for s in shards):
        data_dir.mkdir(parents=True, exist_ok=True)
        for shard, path in zip(plan.shards, shards, strict=True):
            write_shard(path, shard)
    return [AgentSpec(agent_id(i), shards[i], run_dir.path / "agents" / agent_id(i)) for i in range(count)]


def simulated_fleet(plan: SessionPlan, agents: list[AgentSpec], backend: Any = None) -> Any:
    """``fleet.mode = "simulated"``: the logical clients under a transport of the same interface
    (``fedge.simulation.fleet``), trained by ``backend`` (one the caller keeps across sessions) or by a new one of
    the kind ``fleet.backend`` names."""
    from fedge.simulation.backends import make_backend
    from fedge.simulation.fleet import SimulatedFleet
    from fedge.simulation.timing import SimulatedClock
    from fedge.simulation.worker import ClientFiles, WorkerRule

    fleet = plan.config.fleet
    owned = backend is None
    if backend is None:
        backend = make_backend(fleet.backend, fleet.workers, fleet.ray_address)
    clients = [ClientFiles(a.client_id, str(a.shard), str(a.state_dir)) for a in agents]
    rule = WorkerRule(allow_plugins=tuple(ref.name for ref in plan.plugins.values()))
    timing = device_timing(plan.config)
    train, limit = plan.config.train, plan.config.data.train_limit

    def steps(samples: int) -> int:  # a task's planned steps: the batches of the data it trains on
        return train.epochs * max(1, math.ceil((min(samples, limit) if limit > 0 else samples) / train.batch_size))

    return SimulatedFleet(clients, backend, tuple(plan.spec.input_shape), plan.spec.num_classes,
                          [int(len(shard.train_y)) for shard in plan.shards], rule, owns_backend=owned,
                          clock=SimulatedClock() if timing is not None else None, timing=timing,
                          steps=steps if timing is not None else None)


def largest_shard(plan: SessionPlan) -> int:
    """The most training samples any local agent can claim: the weight cap of a local or simulated fleet (0 for
    a bound fleet: its cap is ``robust.max_samples`` or derived from round 1's claims)."""
    if not plan.shards:
        return 0
    largest = max(int(len(shard.train_y)) for shard in plan.shards)
    limit = plan.config.data.train_limit
    return min(largest, limit) if limit > 0 else largest


def curve_keys(config: Config, run_dir: RunDir, bind: str, agents: list[AgentSpec]) -> tuple[
        CurveServerKeys | None, list[AgentSpec]]:
    mode = config.security.curve
    if mode == "off" or (mode == "auto" and is_loopback(bind)):
        return None, agents
    keys_dir = Path(config.security.keys_dir or run_dir.path / "keys")
    if not (keys_dir / f"{COORDINATOR_KEY}.key_secret").exists():
        generate_keys(keys_dir, COORDINATOR_KEY)
    (keys_dir / ALLOWED_DIR).mkdir(parents=True, exist_ok=True)
    with_keys = []
    for agent in agents:
        agent_keys = agent.state_dir / "keys"
        if not (agent_keys / f"{AGENT_KEY}.key_secret").exists():
            public, _ = generate_keys(agent_keys, AGENT_KEY)
            (keys_dir / ALLOWED_DIR / f"{agent.client_id}.key").write_bytes(public.read_bytes())
        with_keys.append(AgentSpec(agent.client_id, agent.shard, agent.state_dir, agent_keys))
    return CurveServerKeys.load(keys_dir), with_keys


def progress_printer(config: Config, quiet: bool) -> Any:
    started = time.monotonic()

    def show(row: dict[str, Any]) -> None:
        if quiet:
            return
        done = row["round"]
        elapsed = time.monotonic() - started
        eta = elapsed / max(done, 1) * (config.run.rounds - done)
        acc_text = "acc   n/a"
        for key, label, scale, unit in (("test_accuracy", "acc", 100, "%"), ("test_exact_match", "exact", 100, "%"),
                                        ("test_mse", "mse", 1, "")):
            value = row.get(key)
            if isinstance(value, float) and not math.isnan(value):
                acc_text = f"{label} {scale * value:5.{1 if unit else 4}f}{unit}"
                break
        what = ("version", f"{row['reported']} updates, staleness <= {row.get('staleness_max')}") \
            if config.round.mode == "async" else ("round", f"{row['reported']}/{row['selected']} agents")
        print(f"{what[0]} {done:>3}/{config.run.rounds} | {acc_text} | {what[1]} | "
              f"down {row['bytes_down'] / 1e6:6.2f} MB up {row['bytes_up'] / 1e6:6.2f} MB | "
              f"{row['wall_s']:5.1f} s | ETA {eta / 60:4.1f} min", flush=True)

    return show


def finish(session: Session, run_dir: RunDir, spec: ModelSpec, outcome: str, wall_s: float) -> dict[str, Any]:
    rows = run_dir.read_jsonl("metrics.jsonl")
    arrays = session.server.evaluation_arrays()
    files: dict[str, str | None] = {"model": None, "onnx": None}
    onnx_parity: float | None = None
    final = outcome in ("done", "budget")  # a spent privacy budget ends the run with its last released model
    if arrays is not None and final:
        save_arrays(run_dir / "model.npz", dict(arrays), {"model": spec.name, "round": session.round})
        files["model"] = "model.npz"
    if arrays is not None and final and session.config.run.export_onnx:
        try:
            from fedge.models import arrays_to_state, build, definition_hash
            from fedge.models.export import export_onnx, onnx_max_abs_difference

            model = build(spec)
            arrays_to_state(model, dict(arrays), strict=False)
            export_onnx(model, spec.input_shape, run_dir / "model.onnx", definition_hash(spec))
            files["onnx"] = "model.onnx"
            batch = np.random.default_rng(0).standard_normal((16, *spec.input_shape)).astype(np.float32)
            onnx_parity = onnx_max_abs_difference(model, run_dir / "model.onnx", batch)
        except Exception as exc:  # the export extra may be missing on a small device
            log.warning("no ONNX export: %s", exc)
    accuracies = [r["test_accuracy"] for r in rows if isinstance(r.get("test_accuracy"), float)]
    report = {
        "run_id": session.run_id, "status": outcome, "algorithm": session.config.algorithm_name,
        "mode": session.config.round.mode, "rounds": session.config.run.rounds, "rounds_completed": session.round,
        "final_test_accuracy": accuracies[-1] if accuracies else None,
        "best_test_accuracy": max(accuracies) if accuracies else None,
        "final_test_loss": rows[-1].get("test_loss") if rows else None,
        "total_bytes_down": sum(r["bytes_down"] for r in rows), "total_bytes_up": sum(r["bytes_up"] for r in rows),
        "wall_s": wall_s, "mean_round_s": (sum(r["wall_s"] for r in rows) / len(rows)) if rows else None,
        "coordinator_rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "agent_rss_peak_mb": max((r["rss_peak_mb"] for r in rows if isinstance(r.get("rss_peak_mb"), float)),
                                 default=None),
        "files": files,
        "onnx_max_abs_difference": onnx_parity,
        "rejections": session.rejections(),
        **session.trust.report(),
        **({"privacy": session.privacy.report()} if session.privacy is not None else {}),
        **({"privacy": session.secagg.noise.report()} if session.secagg is not None and session.secagg.noise else {}),
    }
    run_dir.write_json("report.json", report)
    return report


def command_start(args: argparse.Namespace, flags: dict[str, Any]) -> int:
    plan, path, resuming = resolve_run(args, flags)
    run_dir = RunDir(path)
    lock = hold_run_dir(run_dir)
    setup_logging(json_lines=args.log_json, log_file=str(run_dir / "coordinator.log"),
                  quiet=not getattr(args, "verbose", False))  # the progress lines are the live display
    try:
        report = play(plan, run_dir, resuming, quiet=args.quiet, service=args.service,
                      print_config=getattr(args, "print_config", False))
    finally:
        lock.close()
    if report["status"] == "done":
        acc = report["final_test_accuracy"]
        written = ", ".join(["metrics.jsonl", "clients.jsonl", "report.json",
                             *[name for name in report["files"].values() if name]])
        unit = "versions" if report.get("mode") == "async" else "rounds"
        print(f"done: {report['rounds_completed']} {unit}, final test accuracy "
              f"{'n/a' if acc is None else f'{100 * acc:.2f}%'}; results in {run_dir.path}/ ({written})", flush=True)
        return 0
    if report["status"] == "budget":
        privacy = report["privacy"]
        print(f"stopped at round {report['rounds_completed']}: another round would exceed privacy.max_epsilon = "
              f"{privacy['max_epsilon']} (epsilon {privacy['epsilon']:.4g} at delta {privacy['delta']:.3g}); "
              f"results in {run_dir.path}/", flush=True)
        return 0
    print(f"stopped at round {report['rounds_completed']}; resume with: coordinator start --resume {run_dir.path}",
          flush=True)
    return 0 if report["status"] == "stopped" else 1


def play(plan: SessionPlan, run_dir: RunDir, resuming: bool, quiet: bool = True,
         service: bool = False, backend: Any = None, print_config: bool = False) -> dict[str, Any]:
    """Run a checked session to its end (or until stopped) and return its report (report.json's content).
    ``backend``: a simulated fleet's pool of workers kept by the caller across sessions (``fedge.simulation``);
    ``quiet``: no console lines but warnings; ``print_config``: the effective configuration first."""
    config = plan.config
    one_blas_thread()  # idle OpenBLAS threads spin, and cost the agents sharing these cores their time
    run_dir.write_text("config.toml", to_toml(config))  # a resume's allowed changes (more rounds) included
    if print_config:
        print(f"# effective configuration ({run_dir / 'config.toml'})\n{to_toml(config)}", flush=True)
    local = plan.local
    spec = plan.spec
    bind = config.fleet.bind or "tcp://127.0.0.1:0"
    agents = prepare_local_fleet(plan, run_dir) if local else []
    simulated = config.fleet.mode == "simulated"
    curve, agents = (None, agents) if simulated else curve_keys(config, run_dir, bind, agents)
    num_clients = len(agents) if local else (config.data.clients or config.fleet.expect)
    if num_clients < 1:
        raise ConfigError("serving real devices needs fleet.expect (or data.clients) >= 1")
    from fedge.coordinator.evaluation import GlobalEvaluator

    evaluator = GlobalEvaluator(plan) if plan.dataset is not None and len(plan.dataset.test_y) else None
    transport: Any = simulated_fleet(plan, agents, backend) if simulated else \
        RouterTransport(bind, curve, max_frame_bytes=plan.max_frame_bytes)
    run_dir.write_provenance(config.run.seed, transport.endpoint, {"curve": curve is not None})
    if getattr(transport, "clock", None) is not None:  # a simulated fleet on its own clock: its devices never go
        config = dataclasses.replace(config, fleet=dataclasses.replace(config.fleet, heartbeat_s=NEVER_S,
                                                                       liveness_s=NEVER_S))
    session = Session(config, run_dir, transport, spec, num_clients, evaluator,
                      run_id=uuid.uuid4().hex[:12], reserved_ids=[a.client_id for a in agents],
                      on_round=progress_printer(config, quiet), initial=plan.initial,
                      welcome_extra=plan.welcome_extra(), weight_cap=largest_shard(plan), privacy=plan.privacy,
                      clock=getattr(transport, "clock", None))
    if resuming:
        session.load_checkpoint()
    else:
        session.save_checkpoint()
    fleet = LocalFleet(transport.endpoint, agents,
                       (Path(config.security.keys_dir or run_dir.path / "keys") / f"{COORDINATOR_KEY}.key")
                       if curve else None, allow_plugins=[ref.name for ref in plan.plugins.values()],
                       python=config.fleet.agent_python, min_agents=max(config.round.min_clients, 1))
    if local and not simulated:
        session.on_tick = fleet.watch
    if not quiet:
        say = functools.partial(print, flush=True)
        say(summary_line(config, num_clients, local, run_dir.path))
        if not local:
            for line in serving_lines(transport.endpoint, Path(config.security.keys_dir or run_dir.path / "keys")
                                      if curve else None):
                say(line)
            waiting = WaitingLine(say)
            allow = getattr(transport, "allow_list", None)
            session.on_waiting = lambda live, expect: waiting(
                time.monotonic(), live, expect, allow.refused_count if allow else 0, allow.refused if allow else ())

    def stop(signum: int, _frame: object) -> None:
        log.warning("signal %d: stopping after checkpointing the last completed round", signum)
        session.stopping = True

    import threading

    handlers: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():  # after Ray's own (a simulated fleet's backend)
        for kind in (signal.SIGTERM, signal.SIGINT):
            handlers[kind] = signal.signal(kind, stop)
    log.info("coordinator listening on %s (CurveZMQ %s)", transport.endpoint, "on" if curve else "off")
    started = time.monotonic()
    from fedge.plumbing.service import ServiceNotifier

    with ServiceNotifier(lambda: session.progress) if service else contextlib.nullcontext() as notifier:
        if notifier is not None:
            session.status.show = notifier.show
        if not simulated:
            fleet.start()
        outcome = "stopped"
        try:
            # (a simulated fleet: the clients its trace has there at the start)
            expect = max(transport.present(), 1) if simulated else len(agents) if local else max(config.fleet.expect, 1)
            outcome = session.run(expect, config.fleet.join_timeout_s)
            session.on_tick = None  # agents leave from here on: they are not restarted
            if outcome == "done":  # before the final files: agents need nothing of them, and are not left waiting
                # (finished agents answer with their own Bye; wait for it, at most 5 s)
                session.say_goodbye(codec.vocabulary.BYE_FINISHED, "session finished", wait_s=5.0)
            report = finish(session, run_dir, spec, outcome, time.monotonic() - started)
            if outcome != "done":
                session.say_goodbye(codec.vocabulary.BYE_STOPPING, "coordinator stopping; it will resume")
        finally:
            fleet.stop(grace_s=10.0 if outcome == "done" else 0.5)  # local agents end with their coordinator
            transport.close()
            for kind, handler in handlers.items():
                signal.signal(kind, handler)
    return report
