"""The ``edge-agent`` command: ``run`` (join a coordinator and train), ``predict`` (the committed model on samples,
with onnxruntime, no torch) and ``keygen`` (a CurveZMQ key pair).

    edge-agent run --coordinator tcp://HOST:5555 --client-id pi-01 --data /var/lib/fedge-agent/shard.npz
    edge-agent run --config /etc/fedge/agent.toml
    edge-agent keygen --keys-dir /var/lib/fedge-agent/keys
    edge-agent predict --state-dir /var/lib/fedge-agent/state --input samples.npy

Errors are one line on stderr and a non-zero exit: 2 for a configuration error (settings, keys, a second agent on
the same state directory), 3 when this device's own data cannot be read (its shard, its data callable); the
systemd unit does not restart on either (``RestartPreventExitStatus=2 3``). A session-level refusal (model or
protocol mismatch, a full session, a plugin this device does not allow) does not end the agent: it says hello
again with backoff. SIGTERM and Ctrl-C stop the agent cleanly (exit 0).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from fedge import __version__
from fedge.codec import PROTOCOL_VERSION

EXIT_CONFIG = 2
EXIT_DATA = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-agent", description="Fedge edge agent")
    parser.add_argument("--version", action="version", version=f"edge-agent {__version__} (wire format {PROTOCOL_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="join a coordinator and train on this device's data")
    run.add_argument("--config", help="TOML file with [agent] and [security] sections")
    run.add_argument("--coordinator", help="the coordinator's address, e.g. tcp://192.0.2.10:5555")
    run.add_argument("--client-id", help="this device's stable id")
    run.add_argument("--data", help="this device's shard (.npz written by `coordinator partition --out`) or a data "
                     "callable package.module:callable")
    run.add_argument("--allow-plugin", action="append", default=None, metavar="NAME",
                     help="a plugin name the coordinator may name that this agent will import (repeatable; "
                     "adds to agent.allow_plugins)")
    run.add_argument("--state-dir", help="where device state is kept (default ~/.local/state/fedge-agent/ID)")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"))
    run.add_argument("--curve", choices=("on", "off"), help="CurveZMQ encryption and authentication")
    run.add_argument("--keys-dir", help="directory holding agent.key and agent.key_secret")
    run.add_argument("--coordinator-key", help="the coordinator's public key file")
    run.add_argument("--after-session", choices=("wait", "exit"),
                     help="when a session finishes: wait for the next one (default) or exit")
    run.add_argument("--max-steps", type=int, help="this device's work budget: at most this many steps a round")
    run.add_argument("--max-seconds", type=float, help="this device's work budget: train at most this long a round")
    run.add_argument("--step-delay-s", type=float,
                     help="emulate a slower board: wait this long before each training step (agent.step_delay_s)")
    run.add_argument("--parent-pid", type=int, help="stop when this process is gone (exited, or its pid reused; used by the local fleet)")
    run.add_argument("--log-file", help="also write JSON-lines logs here")
    run.add_argument("--log-json", action="store_true", help="JSON-lines logs on stderr")
    predict = sub.add_parser("predict", help="run this device's latest committed model on samples (no torch needed)")
    predict.add_argument("--input", required=True, help=".npy file: samples (N, sample shape) as stored in a shard, "
                         "or one sample")
    predict.add_argument("--state-dir", help="the agent's state directory (or give --config)")
    predict.add_argument("--config", help="the agent's TOML file, for its state directory")
    predict.add_argument("--onnx", help="an ONNX file of the same model definition (e.g. the coordinator's "
                         "model.onnx) when this device cannot export its own")
    predict.add_argument("--json", action="store_true", help="one JSON object: classes, logits and the model used")
    check = sub.add_parser("check", help="is this device ready? torch, energy source, data, keys, the coordinator; "
                           "one line each, exit 1 when something would stop a session")
    check.add_argument("--config", help="the agent's TOML file")
    check.add_argument("--coordinator", help="the coordinator's address, e.g. tcp://192.0.2.10:5555")
    check.add_argument("--client-id", help="this device's id (the check connects as check-ID: it enrols nothing)")
    check.add_argument("--data", help="this device's shard or data callable")
    check.add_argument("--curve", choices=("on", "off"))
    check.add_argument("--keys-dir")
    check.add_argument("--coordinator-key")
    check.add_argument("--timeout", type=float, default=5.0, help="seconds for each network step (default 5)")
    keygen = sub.add_parser("keygen", help="write a CurveZMQ key pair (agent.key, agent.key_secret)")
    keygen.add_argument("--keys-dir", required=True)
    keygen.add_argument("--force", action="store_true", help="replace an existing key pair")
    return parser



def run_agent(args: argparse.Namespace) -> int:
    from fedge.edge_agent.config import load_settings
    from fedge.plumbing.logsetup import setup_logging
    from fedge.plumbing.threads import one_blas_thread

    setup_logging(json_lines=args.log_json, log_file=args.log_file)
    one_blas_thread()  # idle OpenBLAS threads spin, and cost training its cores
    settings = load_settings(args.config, {
        "coordinator": args.coordinator, "client_id": args.client_id, "data": args.data,
        "state_dir": args.state_dir, "device": args.device, "curve": args.curve, "keys_dir": args.keys_dir,
        "coordinator_public_key": args.coordinator_key, "after_session": args.after_session,
        "step_delay_s": args.step_delay_s, "max_steps": args.max_steps, "max_seconds": args.max_seconds,
    }, extra_plugins=args.allow_plugin or [])
    import torch

    from fedge.edge_agent.lightdynamo import install

    install()  # before torch.optim or the FLOP counter import torch._dynamo: about 60-70 MB less resident
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from fedge.edge_agent.agent import Agent
    from fedge.plumbing.service import ServiceNotifier

    agent = Agent(settings, parent_pid=args.parent_pid)

    def stop(signum: int, _frame: object) -> None:
        logging.getLogger("fedge.agent").info("signal %d: stopping", signum)
        agent.stop_requested.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with ServiceNotifier(agent.watchdog_count, status="starting") as service:
        agent.show_status = service.show
        return agent.run()


def run_check(args: argparse.Namespace) -> int:
    from fedge.edge_agent.check import run_checks
    from fedge.edge_agent.config import load_settings

    settings = load_settings(args.config, {
        "coordinator": args.coordinator, "client_id": args.client_id or ("check" if not args.config else None),
        "data": args.data, "curve": args.curve, "keys_dir": args.keys_dir,
        "coordinator_public_key": args.coordinator_key,
    })
    items = run_checks(settings, args.timeout)
    for item in items:
        print(item.line())
    return 0 if all(item.ok for item in items) else 1


def run_predict(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from fedge.edge_agent.predict import PredictError, Predictor

    state_dir = args.state_dir
    if not state_dir:
        if not args.config:
            raise PredictError("give --state-dir or --config (the agent's TOML file)")
        from fedge.edge_agent.config import load_settings

        state_dir = load_settings(args.config, {}).state_dir
    try:
        samples = np.load(args.input, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise PredictError(f"{args.input}: not a readable .npy file ({exc})") from exc
    predictor = Predictor.open(state_dir, args.onnx)
    logits = predictor.logits(samples)
    if predictor.task == "classification":
        answers: list[Any] = [int(c) for c in np.argmax(logits, axis=1)]
    elif predictor.task == "multilabel":
        answers = [[int(v) for v in row] for row in (logits > 0)]
    else:
        answers = [[float(v) for v in row] for row in logits]
    if args.json:
        key = "classes" if predictor.task == "classification" else "outputs"
        print(json.dumps({**predictor.describe(), "task": predictor.task, key: answers, "logits": logits.tolist()}))
    else:
        print("\n".join(str(a) if not isinstance(a, list) else " ".join(map(str, a)) for a in answers))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "keygen":
            from fedge.plumbing.keys import AGENT_KEY, generate_keys

            public, secret = generate_keys(args.keys_dir, AGENT_KEY, force=args.force)
            print(f"wrote {public} (public: the coordinator's allow-list takes it as allowed/CLIENT_ID.key, named after this agent's client id) and {secret} (keep private)")
            return 0
        if args.command == "predict":
            return run_predict(args)
        if args.command == "check":
            return run_check(args)
        return run_agent(args)
    except Exception as exc:
        from fedge.client.data import LocalDataError

        if isinstance(exc, LocalDataError):
            print(f"edge-agent: data error: {exc}", file=sys.stderr)
            return EXIT_DATA
        if isinstance(exc, (ValueError, FileNotFoundError, OSError)):
            print(f"edge-agent: error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        raise


if __name__ == "__main__":
    sys.exit(main())
