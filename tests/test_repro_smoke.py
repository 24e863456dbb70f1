"""The reproduction commands run end to end: each ``benchmarks/repro_*.py --quick`` finishes, writes its figure and
tables, and its numbers lie in their valid ranges (accuracies in [0, 1], pFedLA's alpha rows sum to 1).

    python -m pytest tests/test_repro_smoke.py

Each test plays its command in this process, as ``python benchmarks/repro_X.py --quick --out DIR`` would
(tests/benchmark_scripts.py), a few seconds each. The measured results themselves are in docs/reproductions.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tests.benchmark_scripts import run_script

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def repro(name: str, out: Path) -> Path:
    """``python benchmarks/repro_NAME.py --quick --out OUT``, played here: it must exit 0; the folder it wrote."""
    assert run_script(f"repro_{name}", "--quick", "--out", str(out)) == 0
    return out


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def is_fraction(value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= 1.0


def flat(values: Any) -> list[float]:
    if isinstance(values, list):
        return [x for item in values for x in flat(item)]
    return [float(values)]


def check_files(out: Path, stem: str, tables: tuple[str, ...]) -> None:
    figure = out / f"{stem}.png"
    assert figure.read_bytes()[:8] == PNG_MAGIC and figure.stat().st_size > 5_000
    report = (out / f"{stem}.md").read_text()
    assert report.startswith("# ")
    assert f"--quick --out {out}`" in report, "the report must give the command with every flag it was run with"
    for table in tables:
        lines = (out / table).read_text().splitlines()
        assert len(lines) >= 2, f"{table} has no rows"


def test_fedbn_outputs(tmp_path: Path) -> None:
    out = repro("fedbn", tmp_path / "fedbn")
    check_files(out, "fedbn", ("fedbn_summary.csv", "fedbn_rounds.csv"))
    summary = load(out / "fedbn.json")
    assert set(summary["accuracy"]) == {"fedavg", "fedbn"}
    for name, accuracy in summary["accuracy"].items():
        assert len(accuracy) == summary["settings"]["rounds"]
        assert all(len(row) == summary["settings"]["clients"] for row in accuracy)
        assert all(is_fraction(a) for a in flat(accuracy)), name
        assert is_fraction(summary["final_mean"][name]) and is_fraction(summary["best_mean"][name])
        assert summary["best_mean"][name] >= summary["final_mean"][name]


def test_pfedla_outputs(tmp_path: Path) -> None:
    out = repro("pfedla", tmp_path / "pfedla")
    check_files(out, "pfedla", ("pfedla_alpha.csv", "pfedla_runs.csv", "pfedla_rounds.csv"))
    summary = load(out / "pfedla.json")
    matrix = summary["alpha_mean_over_layers"]
    assert len(matrix) == 8 and all(len(row) == 8 for row in matrix)
    rows = matrix + [row for client in summary["alpha_per_layer"] for row in client]
    for row in rows:
        assert min(row) >= 0.0
        assert abs(sum(row) - 1.0) < 1e-5
    pilot = summary["pilot"]
    assert pilot["gbar"] > 0 and pilot["gamma"] > 0
    assert math.isclose(summary["hn_lr"], 0.1 / (pilot["gamma"] * summary["settings"]["rounds"] * pilot["gbar"]))
    main = summary["runs"][0]
    assert main["label"] == "rule" and main["hn_lr"] == summary["hn_lr"] and main["guard"] == 0.0
    verdict = main["criterion"]
    assert summary["verdict"] == verdict["passed"] == all(verdict[c]["passed"] for c in ("C1", "C2", "C3"))
    assert 1 <= main["evaluated_round"] <= summary["settings"]["rounds"]
    assert 1 / math.factorial(8) <= verdict["C1"]["p"] <= 1 and 0 <= verdict["strict_rows"] <= 8
    assert all(is_fraction(a) for a in flat(main["accuracy"]))
    assert "VERDICT" in (out / "pfedla.md").read_text()


def test_pan_divergence_outputs(tmp_path: Path) -> None:
    out = repro("pan_divergence", tmp_path / "pan_divergence")
    check_files(out, "pan_divergence", ("pan_divergence_summary.csv", "pan_divergence_rounds.csv"))
    summary = load(out / "pan_divergence.json")
    assert set(summary["runs"]) == {"off", "mul"}
    for trace in summary["runs"].values():
        values = flat(trace["divergence"]) + flat(trace["relative"])
        assert all(math.isfinite(v) and v >= 0.0 for v in values)
        assert min(values) > 0.0, "clients trained on different data must diverge"
        assert all(is_fraction(a) for a in trace["accuracy"])
    assert all(is_fraction(a) for a in summary["final_accuracy"].values())
