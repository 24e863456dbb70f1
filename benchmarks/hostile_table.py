"""The hostile matrix in full, entered through ``benchmarks/attacks.py --hostile``:

    .venv/bin/python benchmarks/attacks.py --hostile --out runs/hostile.jsonl              # the table
    .venv/bin/python benchmarks/attacks.py --hostile --out runs/hostile.jsonl --write-docs # and its docs section
    .venv/bin/python benchmarks/attacks.py --hostile --modes fedavg,ef-fedprox --mutations nan,int32

Every mode of tests/hostile_matrix.py x every mutation of tests/hostile.py (a short simulated session per cell, the
attacker's answer replayed: tests/hostile_rounds.py), the secure-aggregation stage and masked-update cells (played
live), the combinations the configuration refuses, and one cell with real processes (a bound session of 4 agents
under multi-krum, one of them tests/compromised_agent.py sending ``--process-mutation``, empty-sparse-section by
default: finding 3's reproduction). Each cell is refused, bounded, harmless, rounded or zeroed as expected, or
FAILED with its reason. Cells are appended to ``--out`` as JSON lines as they finish and skipped when found there,
so a run can be stopped and resumed. Prints a table: a row per mode, a column per class of mutation.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedge import codec  # noqa: E402
from tests.hostile import KINDS, MUTATIONS, STAGE_MUTATIONS, mutation  # noqa: E402
from tests.hostile_matrix import (  # noqa: E402
    MODES,
    REFUSED_COMBINATIONS,
    SECURE_MODES,
    SECURE_PLAIN,
    Recorded,
    refused_plan,
    verdict,
)

DOCS = ROOT / "docs" / "results" / "robustness.md"
BEGIN, END = "<!-- hostile-matrix: begin (benchmarks/attacks.py --hostile --write-docs) -->", \
    "<!-- hostile-matrix: end -->"
STAGE, MASKED, CONFIG, PROCESSES = "stage", "masked update", "configuration", "processes"


def cells(recorded: Recorded, modes: set[str] | None, mutations: set[str] | None,
          process_mutation: str) -> Iterator[tuple[str, str, str, str, Callable[[], tuple[str, str]]]]:
    """(mode, class, name, key, run) for every cell; ``run()`` gives (the outcome expected, '' or why it failed)."""
    def wanted(mode: str, name: str) -> bool:
        return (modes is None or mode in modes) and (mutations is None or name in mutations)

    for mode in MODES:
        for m in MUTATIONS:
            if wanted(mode.name, m.name):
                def run(mode: Any = mode, m: Any = m) -> tuple[str, str]:
                    closed, expected, expect = recorded.cell(mode, m)
                    return expect, verdict(closed, expected, expect)
                yield mode.name, m.kind, m.name, f"{mode.name}|{m.name}", run
    for mode in SECURE_MODES:
        for stage in STAGE_MUTATIONS:
            if wanted(mode.name, stage.name):
                def run_stage(mode: Any = mode, stage: Any = stage) -> tuple[str, str]:
                    from tests.hostile import stage_frames

                    closed = recorded.live(mode, stage.kind, stage_frames(stage, "agent-01"))
                    return stage.expect, verdict(closed, recorded.live_expected(mode, stage.kind, stage.expect),
                                                 stage.expect)
                yield mode.name, STAGE, stage.name, f"{mode.name}|{stage.name}", run_stage
        for name in SECURE_PLAIN:
            if wanted(mode.name, name):
                def run_masked(mode: Any = mode, name: str = name) -> tuple[str, str]:
                    plain = mutation(name)
                    assert isinstance(plain.expect, str)
                    closed = recorded.live(mode, codec.Update, lambda frame: plain.make(frame, []))
                    return plain.expect, verdict(closed, recorded.live_expected(mode, codec.Update, plain.expect),
                                                 plain.expect)
                yield mode.name, MASKED, name, f"{mode.name}|masked|{name}", run_masked
    for sets in REFUSED_COMBINATIONS:
        label = "+".join(s.split("=", 1)[1] for s in sets)
        if wanted("refused combinations", label):
            def run_config(sets: tuple[str, ...] = sets) -> tuple[str, str]:
                from fedge.coordinator.config import ConfigError

                try:
                    refused_plan(sets)
                except ConfigError:
                    return "refused", ""
                return "refused", "the configuration accepted it"
            yield "refused combinations", CONFIG, label, f"config|{label}", run_config
    if process_mutation and wanted("fedavg+multi-krum, processes", process_mutation):
        yield "fedavg+multi-krum, processes", PROCESSES, process_mutation, f"processes|{process_mutation}", \
            lambda: process_cell(process_mutation)


def process_cell(name: str, clients: int = 4, rounds: int = 2) -> tuple[str, str]:
    """A bound session (``coordinator start --bind``, multi-krum) of ``clients`` agent processes, agent pi-00 the
    stock agent sending mutation ``name`` instead of its updates: the session must finish every round, the
    attacker refused in each, every other agent's update accepted."""
    from benchmarks.attack_processes import session

    extra = ("--set", "robust.aggregator=multi-krum", "--set", "robust.byzantine=1",
             "--set", "round.deadline_s=120")
    with tempfile.TemporaryDirectory(prefix="fedge-hostile-processes-") as tmp:
        began = time.monotonic()
        try:
            report = session(Path(tmp), 0, rounds, clients, f"hostile:{name}", extra)
        except Exception as exc:
            return "refused", f"the session did not finish: {type(exc).__name__}: {exc}"
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "clients.jsonl").read_text().splitlines()]
    seconds = time.monotonic() - began
    attacker = [r for r in rows if r["client_id"] == "pi-00"]
    others = [r for r in rows if r["client_id"] != "pi-00"]
    if report.get("rounds_completed", rounds) < rounds:
        return "refused", f"{report.get('rounds_completed')} of {rounds} rounds completed"
    if len(attacker) != rounds or not all(r.get("refused") for r in attacker):
        return "refused", f"the attacker's rows: {attacker}"
    if any(r.get("refused") or "num_samples" not in r for r in others):
        return "refused", f"another agent's update was not accepted: {[r for r in others if 'num_samples' not in r]}"
    return "refused", "" if seconds < 100 * rounds else f"the rounds waited for their deadline ({seconds:.0f} s)"


def machine() -> str:
    import numpy
    import torch

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch " \
           f"{torch.__version__}, numpy {numpy.__version__}"


def table(done: list[dict[str, Any]]) -> str:
    """A row per mode, a column per class: the outcomes its cells met, or FAILED with the first failure."""
    columns = [*KINDS, STAGE, MASKED, CONFIG, PROCESSES]
    columns = [c for c in columns if any(cell["kind"] == c for cell in done)]
    modes = list(dict.fromkeys(cell["mode"] for cell in done))
    lines = ["| mode | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for mode in modes:
        row = []
        for column in columns:
            group = [c for c in done if c["mode"] == mode and c["kind"] == column]
            failed = [c for c in group if c["problem"]]
            if not group:
                row.append("")
            elif failed:
                row.append(f"**FAILED** {len(failed)}/{len(group)}: " + ", ".join(c["mutation"] for c in failed))
            else:
                outcomes = sorted({c["expect"] for c in group})
                row.append(f"{'/'.join(outcomes)} ({len(group)})")
        lines.append(f"| {mode} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def failures(done: list[dict[str, Any]]) -> str:
    failed = [c for c in done if c["problem"]]
    return "\n".join(f"- {c['mode']} x {c['mutation']} (expected {c['expect']}): {c['problem'][:300]}"
                     for c in failed) or "None."


def write_docs(done: list[dict[str, Any]], command: str, seconds: float) -> None:
    passed = sum(1 for c in done if not c["problem"])
    section = "\n".join([
        BEGIN, "", "## Hostile updates in every mode", "",
        textwrap.fill("Each cell is one short simulated session (tests/hostile_rounds.py: the real Session, its protocol, "
        "validation, fold and close) in which one device answers a task with a structural mutation of its honest "
        "update (tests/hostile.py), compared byte for byte with the round closed as the outcome says: **refused** "
        "(as if the device had sent nothing, with a warning naming it), **bounded** (the honest update claiming the "
        "weight cap), **harmless** (the honest update), **rounded** (the honest update rounded through float16), "
        "**zeroed** (the honest update with its section's values zero). Secure modes are played live, each stage "
        "message compared with the round in which the same device did not send it. The number in brackets counts "
        "the cells of that class.", width=115), "",
        f"`{command}`", "",
        textwrap.fill(f"Measured {datetime.date.today().isoformat()} on {machine()}; {len(done)} cells, {passed} as "
                      f"expected, {seconds / 60:.0f} minutes of cells.", width=115), "",
        table(done), "", "Cells that failed:", "", failures(done), "", END])
    text = DOCS.read_text() if DOCS.exists() else "# Robustness: attacks against the defences, measured\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    DOCS.write_text(text)


def hostile_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/hostile.jsonl", help="cells as JSON lines (kept ones are skipped)")
    parser.add_argument("--modes", default="", help="comma-separated mode names (all when empty)")
    parser.add_argument("--mutations", default="", help="comma-separated mutation names (all when empty)")
    parser.add_argument("--process-mutation", default="empty-sparse-section",
                        help="the mutation of the real-process cell ('' for none)")
    parser.add_argument("--write-docs", action="store_true", help=f"write the table into {DOCS.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = {}
    if out.exists():
        kept = {c["key"]: c for c in (json.loads(line) for line in out.read_text().splitlines() if line.strip())}
    recorded = Recorded()
    done = []
    for mode, kind, name, key, run in cells(recorded, set(args.modes.split(",")) if args.modes else None,
                                            set(args.mutations.split(",")) if args.mutations else None,
                                            args.process_mutation):
        if key not in kept:
            began = time.monotonic()
            try:
                expect, problem = run()
            except Exception as exc:  # the harness's own failure is a failed cell too, with its reason
                expect, problem = "?", f"{type(exc).__name__}: {exc}"
            kept[key] = {"key": key, "mode": mode, "kind": kind, "mutation": name, "expect": expect,
                         "problem": problem, "seconds": round(time.monotonic() - began, 3)}
            with out.open("a") as f:
                f.write(json.dumps(kept[key]) + "\n")
            print(f"{'FAILED' if problem else 'ok':6} {mode} x {name}: {expect} {problem[:200]}", flush=True)
        done.append(kept[key])
    print()
    print(table(done))
    print()
    print(failures(done))
    if args.write_docs:
        seconds = sum(c["seconds"] for c in done)
        write_docs(done, ".venv/bin/python benchmarks/attacks.py --hostile " + " ".join(argv), seconds)
    return 0
