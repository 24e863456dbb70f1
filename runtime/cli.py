"""The ``coordinator`` command.

    coordinator start --rounds 50                         # a local fleet of 10 agents on loopback, the demo data
    coordinator start --bind tcp://0.0.0.0:5555 --expect 8 --config session.toml   # serve real devices
    coordinator start --resume runs/RUN                   # continue a stopped or crashed run
    coordinator replay runs/RUN --data dev-0=SHARD ...    # an asynchronous run's journal again, to its model's bits
    coordinator status runs/RUN
    coordinator keygen --keys-dir DIR
    coordinator models [--json]
    coordinator report runs/RUN [--vs runs/OTHER] [-o DIR]  # markdown + PNG plots, claims check
    coordinator dashboard runs/ [--listen 127.0.0.1:0]      # a live web page over the runs (docs/dashboard.md)
    coordinator export runs/RUN --tensorboard DIR | --mlflow URI   # to the tracking tools (docs/meter.md)
    coordinator sweep --grid benchmarks/grids/small.toml     # the reproduction harness (resumable)
    coordinator partition --dataset fmnist-demo --partition dirichlet --clients 10 --alpha 0.3 --seed 0 [--out DIR]

Errors are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedge import __version__
from fedge.codec import PROTOCOL_VERSION
from fedge.coordinator.config import ConfigError, SessionDataError


def add_start(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    start = sub.add_parser("start", help="run a federated session")
    start.add_argument("--config", help="TOML config ([run], [fleet], [data], [model], [train], [round], ...)")
    start.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a config key (repeatable); VALUE is a TOML literal or a string")
    start.add_argument("--rounds", type=int, help="run.rounds")
    start.add_argument("--local-fleet", type=int, metavar="N", help="fleet.local_agents")
    start.add_argument("--algorithm", help="algorithm.name")
    start.add_argument("--model", help="model.name")
    start.add_argument("--dataset", help="data.dataset")
    start.add_argument("--data-dir", help="data.path")
    start.add_argument("--partition", help="data.partition")
    start.add_argument("--alpha", type=float, help="data.alpha")
    start.add_argument("--seed", type=int, help="run.seed")
    start.add_argument("--run-dir", help="run.run_dir (default: runs/DATE-ALGORITHM)")
    start.add_argument("--bind", help="fleet.bind: serve real devices at this address instead of a local fleet")
    start.add_argument("--expect", type=int, help="fleet.expect: agents to wait for before round 1")
    start.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint")
    start.add_argument("--service", action="store_true",
                       help="run as a service: resume RUN_DIR if it has a checkpoint, else start; notify systemd")
    start.add_argument("--quiet", action="store_true", help="no progress lines, warnings only")
    start.add_argument("--print-config", action="store_true",
                       help="print the effective configuration first (it is always written to RUN_DIR/config.toml)")
    start.add_argument("--verbose", action="store_true", help="info logs on stderr beside the progress lines")
    start.add_argument("--log-json", action="store_true", help="JSON-lines logs on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordinator", description="Fedge coordinator")
    parser.add_argument("--version", action="version",
                        version=f"coordinator {__version__} (wire format {PROTOCOL_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True)
    add_start(sub)
    status = sub.add_parser("status", help="show a run's round, connected agents and ETA")
    status.add_argument("run_dir")
    status.add_argument("--json", action="store_true")
    status.add_argument("--agents", action="store_true",
                        help="every agent of the session (agents.json), not only the 100 heard from last")
    quarantine = sub.add_parser("quarantine", help="list a session's quarantined devices, or let one back")
    quarantine.add_argument("run_dir")
    what = quarantine.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="the quarantined devices and every device's streak "
                      "(the default)")
    what.add_argument("--clear", metavar="CLIENT_ID", help="let this device back at the session's next round start")
    keygen = sub.add_parser("keygen", help="write the coordinator's CurveZMQ key pair and an empty allow-list")
    keygen.add_argument("--keys-dir", required=True)
    keygen.add_argument("--force", action="store_true", help="replace an existing key pair")
    models = sub.add_parser("models", help="list the models and their parameter counts")
    models.add_argument("--json", action="store_true")
    report = sub.add_parser("report", help="a markdown report with plots of a run (and its reduction against another)")
    report.add_argument("run_dir")
    report.add_argument("--vs", metavar="OTHER_RUN_DIR", help="compare against this run (e.g. FedAvg)")
    report.add_argument("-o", "--out", help="output directory (default: RUN_DIR)")
    dashboard = sub.add_parser("dashboard", help="serve a live, read-only web page over run directories")
    dashboard.add_argument("path", nargs="?", default="runs", help="a runs directory or one run (default: runs)")
    dashboard.add_argument("--listen", default="127.0.0.1:0",
                           help="HOST:PORT (default 127.0.0.1:0: loopback, a free port); off loopback a token is "
                                "needed, printed once in the URL")
    dashboard.add_argument("--token-file", help="where the token is written, mode 0600, outside the served "
                           "directory (default ~/.config/fedge/dashboard.token)")
    export = sub.add_parser("export", help="export a run's metrics and configuration to TensorBoard or MLflow")
    export.add_argument("run_dir", help="the run directory to export (docs/run-dir.md)")
    export.add_argument("--tensorboard", metavar="DIR",
                        help="write TensorBoard event files to DIR/RUN_NAME (pip install 'fedge[tensorboard]')")
    export.add_argument("--mlflow", metavar="URI",
                        help="log a new MLflow run to this tracking URI (pip install 'fedge[mlflow]')")
    export.add_argument("--experiment", metavar="NAME", help="the MLflow experiment, created if missing "
                        "(default fedge)")
    sweep = sub.add_parser("sweep", help="run a grid of sessions (resumable) and tabulate them")
    sweep.add_argument("--grid", required=True, help="grid TOML (see benchmarks/grids/)")
    sweep.add_argument("--out", help="output directory (default runs/sweep-GRID)")
    sweep.add_argument("--dry-run", action="store_true", help="list the runs and stop")
    sweep.add_argument("--verbose", action="store_true", help="show each run's progress lines")
    sweep.add_argument("--jobs", type=int, default=1, help="runs at a time on this machine (default 1)")
    sweep.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="ray: each run is a Ray task on the cluster (pip install 'fedge[ray]')")
    sweep.add_argument("--ray-address", default="", help="the Ray cluster to join (default: a private local one)")
    sweep.add_argument("--cell-mode", choices=("process", "simulated"), default="process",
                       help="each run's fleet: agent processes (default) or a simulated fleet with local workers")
    sweep.add_argument("--shard", metavar="I/N", help="run only every N-th cell, starting at the I-th (1-based)")
    from fedge.runtime.replay import add_replay

    add_replay(sub)
    partition = sub.add_parser("partition", help="split a dataset into client shards")
    from fedge.fldata.cli import add_partition_arguments

    add_partition_arguments(partition)
    return parser


def flags_of(args: argparse.Namespace) -> dict[str, object]:
    return {
        "run.rounds": args.rounds, "fleet.local_agents": args.local_fleet, "algorithm.name": args.algorithm,
        "model.name": args.model, "data.dataset": args.dataset, "data.path": args.data_dir,
        "data.partition": args.partition, "data.alpha": args.alpha, "run.seed": args.seed,
        "run.run_dir": args.run_dir, "fleet.bind": args.bind, "fleet.expect": args.expect,
    }


def command_status(args: argparse.Namespace) -> int:
    path = Path(args.run_dir) / "status.json"
    if not path.exists():
        raise FileNotFoundError(f"{args.run_dir} has no status.json: is it a run directory?")
    try:
        status = json.loads(path.read_text())
    except ValueError:  # status files are not fsynced: a power cut can leave one empty until the next write
        raise ValueError(f"{path} cannot be read (empty or cut short, as after a power cut; the coordinator "
                         "rewrites it within a second while it runs)") from None
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    age = time.time() - float(status.get("updated_at", 0))
    eta = status.get("eta_s")
    print(f"run {status['run_id']} ({status['algorithm']}): round {status['round']}/{status['rounds']}, "
          f"{status['phase']} (updated {age:.0f} s ago)" + (f", ETA {eta / 60:.1f} min" if eta else ""))
    privacy = status.get("privacy")
    if privacy:
        print(f"  privacy: epsilon {privacy['epsilon']:.4g} at delta {privacy['delta']:.3g} after "
              f"{privacy['rounds']} accounted round(s) ({privacy['accountant']}"
              + (f", {privacy['sampling']} sampling" if privacy.get("sampling") else "")
              + (f"; stops before {privacy['max_epsilon']}" if privacy.get("max_epsilon") else "") + ")")
    agents = status.get("agents", [])
    if args.agents:
        listed = Path(args.run_dir) / "agents.json"
        if not listed.exists():
            raise FileNotFoundError(f"{args.run_dir} has no agents.json yet (written every 10 s while it runs)")
        agents = json.loads(listed.read_text()).get("agents", [])
    total = int(status.get("agents_total", len(agents)))
    print(f"  {status.get('agents_connected', sum(1 for a in agents if a['connected']))} of {total} agents "
          "connected" + (f"; the {len(agents)} heard from last (all: --agents)" if len(agents) < total else ""))
    for agent in agents:
        seen, took = agent.get("seconds_since_seen"), agent.get("round_s")
        bounded = ", ".join(f"{agent[k]} {k}" for k in ("capped", "clipped", "rejected") if agent.get(k))
        print(f"  {agent['client_id']:<20} client {agent['index']:<3} "
              f"{'connected' if agent['connected'] else 'gone':<10}"
              + (f" last heard {seen:.0f} s before the update" if seen is not None else "")
              + (f"; rounds take about {took:.1f} s" if took is not None else "")
              + (f"; updates {bounded}" if bounded else "") + ("; QUARANTINED" if agent.get("quarantined") else ""))
    return 0


def command_quarantine(args: argparse.Namespace) -> int:
    from fedge.coordinator.quarantine import read_quarantine, request_clear

    if not (Path(args.run_dir) / "provenance.json").exists():
        raise FileNotFoundError(f"{args.run_dir} is not a run directory (no provenance.json)")
    if args.clear:
        path = request_clear(args.run_dir, args.clear)
        print(f"asked the session to let {args.clear} back at its next round start ({path})")
        return 0
    state = read_quarantine(args.run_dir)
    quarantined = state.get("quarantined", {})
    print(f"{len(quarantined)} device(s) quarantined (robust.quarantine_after = {state.get('after', 0)})")
    for client_id, why in sorted(quarantined.items()):
        print(f"  {client_id:<20} since round {why.get('round')}: {why.get('reason')}")
    streaks = {k: v for k, v in state.get("streaks", {}).items() if k not in quarantined}
    for client_id, streak in sorted(streaks.items()):
        print(f"  {client_id:<20} {streak} round(s) in a row clipped or refused")
    return 0


def command_keygen(args: argparse.Namespace) -> int:
    from fedge.coordinator.transport import ALLOWED_DIR, COORDINATOR_KEY, generate_keys

    public, secret = generate_keys(args.keys_dir, COORDINATOR_KEY, force=args.force)
    (Path(args.keys_dir) / ALLOWED_DIR).mkdir(exist_ok=True)
    print(f"wrote {public} (give it to every agent) and {secret} (keep private); "
          f"put each agent's public key in {Path(args.keys_dir) / ALLOWED_DIR}/CLIENT_ID.key (the client id the "
          "key is allowed as)")
    return 0


def command_models(args: argparse.Namespace) -> int:
    from fedge.models import describe_models

    rows = describe_models()
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'model':<8} {'input':<10} {'params':>10} {'prunable':>10}")
    for row in rows:
        shape = "x".join(str(x) for x in row["input_shape"])  # type: ignore[attr-defined]
        print(f"{row['name']:<8} {shape:<10} {row['params']:>10,} {row['prunable']:>10,}")
    return 0


def command_dashboard(args: argparse.Namespace) -> int:
    from fedge.dashboard.server import make_server

    server, url = make_server(Path(args.path), args.listen, Path(args.token_file) if args.token_file else None)
    print(url, flush=True)  # the first line: what to open (with the token, off loopback; shown only here)
    print(f"serving the runs under {Path(args.path).resolve()} read-only; Ctrl-C stops", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "start":
            from fedge.plumbing.threads import one_blas_thread
            from fedge.runtime.launch import command_start

            one_blas_thread()  # a bad FEDGE_BLAS_THREADS is refused before the run directory is made
            return command_start(args, flags_of(args))
        if args.command == "status":
            return command_status(args)
        if args.command == "keygen":
            return command_keygen(args)
        if args.command == "quarantine":
            return command_quarantine(args)
        if args.command == "models":
            return command_models(args)
        if args.command == "report":
            from fedge.meter.report import write_report

            print(f"wrote {write_report(args.run_dir, vs=args.vs, out_dir=args.out)}")
            return 0
        if args.command == "dashboard":
            return command_dashboard(args)
        if args.command == "export":
            from fedge.meter.export import command_export

            return command_export(args)
        if args.command == "replay":
            from fedge.runtime.replay import command_replay

            return command_replay(args)
        if args.command == "sweep":
            from fedge.sweep.grid import command_sweep

            return command_sweep(args.grid, args.out, args.dry_run, quiet=not args.verbose, jobs=args.jobs,
                                 backend=args.backend, shard=args.shard, cell_mode=args.cell_mode,
                                 ray_address=args.ray_address)
        from fedge.fldata.cli import run_partition

        return run_partition(args)
    except Exception as exc:
        return one_line_error(exc)


EXIT_CONFIG = 2
EXIT_DATA = 3
EXIT_FLEET_LOST = 4


def one_line_error(exc: Exception) -> int:
    """Every error a user can cause, as one line on stderr and its exit code (docs/deployment.md, "Exit codes"):
    2 for configuration, 3 for the data, 4 for a lost local fleet; anything else is a bug and keeps its traceback."""
    from fedge.fldata import DataError
    from fedge.runtime.localfleet import FleetLost

    if isinstance(exc, FleetLost):
        print(f"coordinator: error: {exc}", file=sys.stderr)
        return EXIT_FLEET_LOST
    if isinstance(exc, (SessionDataError, DataError)):
        print(f"coordinator: data error: {exc}", file=sys.stderr)
        return EXIT_DATA
    if isinstance(exc, ImportError):
        hint = str(exc) if "pip install" in str(exc) else (  # an optional extra names its own install
            f"this command needs {exc.name or exc}, which is not installed (the coordinator install has it: "
            "bash scripts/install.sh)")
        print(f"coordinator: error: {hint}", file=sys.stderr)
        return EXIT_CONFIG
    if isinstance(exc, (ConfigError, ValueError, FileNotFoundError, KeyError, OSError)):
        print(f"coordinator: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    raise exc


if __name__ == "__main__":
    sys.exit(main())
