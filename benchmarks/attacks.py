"""The attack harness: compromised devices against Fedge's defences, on the simulated fleet (inline backend), each
attacked run paired with the clean run of the same seed and defence; with ``--hostile``, the hostile matrix instead
(``hostile_main``: every mode x every structural mutation of an honest update, the secure-aggregation stage cells,
the combinations the configuration refuses, and one cell with real processes).

    .venv/bin/python benchmarks/attacks.py                                   # the headline cell, seeds 0-2
    .venv/bin/python benchmarks/attacks.py --attacks inflate-flip,sign-flip --defences bounds,none \\
        --norm-factors 1.5,3 --seeds 0,1 --out runs/attacks.jsonl            # resumable: done cells are skipped
    for k in 0 1 2; do .venv/bin/python benchmarks/attacks.py ... --out runs/a.jsonl --shard $k/3 & done; wait
    .venv/bin/python benchmarks/attacks.py ... --out runs/a.jsonl           # the shards' table (nothing left to run)

    .venv/bin/python benchmarks/attacks.py --hostile --out runs/hostile.jsonl --write-docs   # resumable by cell

Setup: ``--clients`` devices (10) at full participation, fmnist-demo, Dirichlet 0.3 (``--partition iid`` for
the IID column), mlp, FedAvg (``--algorithm``), ``--rounds`` (10); the first ``--attackers`` devices are compromised (tests/attackers.py wraps the client-round function: the
shipped agent holds no attack). Defences: ``bounds`` (the default bounded influence, with ``--norm-factors``),
``none`` (``norm_factor = 0``, a cap above any claim), and each robust aggregator (``trimmed-mean``, ``median``,
``multi-krum``, ``centered-clip``) over the default bounds, with ``byzantine`` = the attackers expected per cohort
(``--attackers`` times ``--fraction``; with 100 clients at 10 % the count per cohort is binomial, and
``rounds_over_byzantine`` counts the rounds where it was higher). Attacks: the update rewriters of
tests/attackers.py, ``label-flip`` and ``alie`` (the colluders' own honest updates give its mean and std). Prints one JSON line per cell and a table with the paired
gap (clean minus attacked, in points) and how many honest updates the bounds clipped or capped in the clean run (and, in the JSON, how many an ef device
scaled itself under the announced bound: ``honest_self_clipped``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedge.api import run_session, session_config  # noqa: E402
from tests.attackers import ATTACKS, alie, compromised, label_flip  # noqa: E402

ATTACK_NAMES = (*ATTACKS, "label-flip", "alie")

OFF = {"norm_factor": 0.0, "max_samples": 10**12}


def session(seed: int, clients: int, rounds: int, robust: dict[str, Any], fraction: float,
            partition: str = "dirichlet", algorithm: str = "fedavg") -> Any:
    return session_config(run={"rounds": rounds, "seed": seed, "export_onnx": False},
                          data={"dataset": "fmnist-demo", "partition": partition, "alpha": 0.3, "clients": clients},
                          fleet={"mode": "simulated", "backend": "inline"}, model={"name": "mlp"},
                          round={"fraction": fraction}, robust=robust,
                          **({} if algorithm == "embedded" else {"algorithm": {"name": algorithm}}))


def attacked(attack: str, ids: set[str], workdir: Path, cohort: int) -> Any:
    """The context in which the devices ``ids`` run ``attack``."""
    if attack == "label-flip":
        return label_flip(ids, workdir)
    if attack == "alie":
        return alie(ids, cohort)
    return compromised(ids, ATTACKS[attack]())


def run(seed: int, clients: int, rounds: int, robust: dict[str, Any], attack: str, attackers: int,
        fraction: float = 1.0, partition: str = "dirichlet", algorithm: str = "fedavg") -> dict[str, Any]:
    ids = {f"agent-{i:02d}" if clients <= 100 else f"agent-{i:03d}" for i in range(attackers)}
    with tempfile.TemporaryDirectory(prefix="fedge-attack-") as tmp:
        config = session(seed, clients, rounds, robust, fraction, partition, algorithm)
        if attack == "clean":
            report = run_session(config, Path(tmp) / "run")
        else:
            with attacked(attack, ids, Path(tmp), max(1, round(clients * fraction))):
                report = run_session(config, Path(tmp) / "run")
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "clients.jsonl").read_text().splitlines()]
    per_round = [sum(1 for r in rows if r["round"] == n and r["client_id"] in ids) for n in range(1, rounds + 1)]
    return {"accuracy": report["final_test_accuracy"], "capped": report["robust"]["capped"],
            "clipped": report["robust"]["clipped"], "attackers_per_round": per_round,
            "self_clipped": sum(1 for r in rows if r.get("device_clip_scale", 1.0) < 1.0),
            "updates": sum(1 for r in rows if r.get("available", True))}


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if "--hostile" in argv:
        from benchmarks.hostile_table import hostile_main

        return hostile_main([a for a in argv if a != "--hostile"])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attacks", default="inflate-flip", help=f"comma-separated: {', '.join(ATTACK_NAMES)}")
    parser.add_argument("--defences", default="bounds,none")
    parser.add_argument("--norm-factors", default="3", help="robust.norm_factor values for the bounds defence")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--attackers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=1.0, help="round.fraction (0.1 with --clients 100)")
    parser.add_argument("--partition", default="dirichlet", choices=("dirichlet", "iid"))
    parser.add_argument("--algorithm", default="fedavg", help="fedavg, fedprox, ef-fedavg, ..., or embedded (the "
                        "embedded default: ef-fedprox, keep 0.3, ternary values)")
    parser.add_argument("--shard", default="", help="K/N: run only the clean runs numbered K modulo N and the "
                        "attacked cells paired with them (with --out; "
                        "start N processes, then once more without --shard for the table)")
    parser.add_argument("--out", default="", help="append each cell here as JSON and skip the cells it holds")
    parser.add_argument("--figure", default="", help="write a bar chart of the attacked accuracy here (matplotlib)")
    args = parser.parse_args(argv)
    shard, shards = 0, 1
    if args.shard:
        try:
            shard, shards = (int(part) for part in args.shard.split("/"))
        except ValueError:
            parser.error(f"--shard takes K/N, got {args.shard!r}")
        if not 0 <= shard < shards or not args.out:
            parser.error("--shard K/N needs 0 <= K < N and --out (the shards share the file)")
    variant = (f"|{args.partition}" if args.partition != "dirichlet" else "") + \
        (f"|{args.algorithm}" if args.algorithm != "fedavg" else "")
    done: dict[str, dict[str, Any]] = {}
    out = Path(args.out) if args.out else None
    if out is not None and out.exists():
        for line in out.read_text().splitlines():
            cell = json.loads(line)
            done[cell["key"]] = cell
    cells = []
    cleans: dict[str, dict[str, Any]] = {}
    groups_seen: dict[str, int] = {}  # a shard takes whole clean runs: every cell paired with one clean run
    for attack in args.attacks.split(","):
        if attack not in ATTACK_NAMES:
            parser.error(f"unknown attack {attack!r}: {', '.join(ATTACK_NAMES)}")
        for defence in args.defences.split(","):
            factors = [float(f) for f in args.norm_factors.split(",")] if defence == "bounds" else [0.0]
            for factor in factors:
                robust = OFF if defence == "none" else {"norm_factor": factor} if defence == "bounds" else \
                    {"aggregator": defence, "byzantine": max(1, round(args.attackers * args.fraction))}
                for seed in (int(s) for s in args.seeds.split(",")):
                    key = f"{attack}|{defence}|{factor}|{seed}|{args.clients}|{args.attackers}|{args.rounds}" + \
                        (f"|{args.fraction}" if args.fraction != 1.0 else "") + variant
                    clean_key = f"{defence}|{factor}|{seed}|{args.clients}|{args.rounds}|{args.attackers}|" \
                                f"{args.fraction}{variant}"
                    number = groups_seen.setdefault(clean_key, len(groups_seen))
                    if key not in done and number % shards != shard:
                        continue  # another shard's cell
                    if key not in done:
                        if clean_key not in cleans:  # the clean run of a defence and seed serves every attack
                            cleans[clean_key] = run(seed, args.clients, args.rounds, robust, "clean", 0,
                                                    args.fraction, args.partition, args.algorithm)
                        clean = cleans[clean_key]
                        hit = run(seed, args.clients, args.rounds, robust, attack, args.attackers, args.fraction,
                                  args.partition, args.algorithm)
                        done[key] = {"key": key, "attack": attack, "defence": defence, "norm_factor": factor,
                                     "partition": args.partition, "algorithm": args.algorithm,
                                     "seed": seed, "clean": clean["accuracy"], "attacked": hit["accuracy"],
                                     "gap_points": 100 * (clean["accuracy"] - hit["accuracy"]),
                                     "honest_clipped": clean["clipped"], "honest_capped": clean["capped"],
                                     "honest_self_clipped": clean["self_clipped"],
                                     "honest_updates": clean["updates"],
                                     "attackers_per_round": hit["attackers_per_round"],
                                     "rounds_over_byzantine": sum(
                                         1 for a in hit["attackers_per_round"]
                                         if a > max(1, round(args.attackers * args.fraction)))}
                        print(json.dumps(done[key]), flush=True)
                        if out is not None:
                            with out.open("a") as f:
                                f.write(json.dumps(done[key]) + "\n")
                    cells.append(done[key])
    if shards > 1:
        return 0  # the table comes from a run without --shard over the shared --out
    print("\n| attack | defence | norm_factor | seeds | clean | attacked | gap, points (mean; max) | honest clipped |")
    print("|---|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["attack"], cell["defence"], cell["norm_factor"]), []).append(cell)
    for (attack, defence, factor), group in groups.items():
        def mean(name: str, group: list[dict[str, Any]] = group) -> float:
            return sum(c[name] for c in group) / len(group)
        clipped = sum(c["honest_clipped"] for c in group)
        total = sum(c["honest_updates"] for c in group)
        print(f"| {attack} | {defence} | {factor if defence == 'bounds' else '-'} | "
              f"{','.join(str(c['seed']) for c in group)} | {100 * mean('clean'):.1f} % | {100 * mean('attacked'):.1f} % "
              f"| {mean('gap_points'):+.1f}; {max(c['gap_points'] for c in group):+.1f} | {clipped}/{total} |")
    if args.figure:
        figure(groups, Path(args.figure))
    return 0


def figure(groups: dict[tuple[str, str, float], list[dict[str, Any]]], path: Path) -> None:
    """Attacked accuracy per attack (x) and defence (bars), with the clean runs' mean as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attacks = list(dict.fromkeys(a for a, _, _ in groups))
    defences = list(dict.fromkeys((d, f) for _, d, f in groups))
    width = 0.8 / max(len(defences), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(attacks)), 3.6))
    for k, (defence, factor) in enumerate(defences):
        values = [100 * sum(c["attacked"] for c in groups.get((a, defence, factor), [])) /
                  max(len(groups.get((a, defence, factor), [])), 1) for a in attacks]
        ax.bar([i + k * width for i in range(len(attacks))], values, width,
               label=defence + (f" {factor:g}" if defence == "bounds" else ""))
    clean = [c["clean"] for group in groups.values() for c in group]
    ax.axhline(100 * sum(clean) / len(clean), color="black", linewidth=0.8, linestyle="--", label="clean (mean)")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(attacks))], attacks)
    ax.set_ylabel("final test accuracy, %")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, ncol=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
