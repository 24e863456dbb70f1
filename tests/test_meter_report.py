"""The run report: reductions per figure and accounting, the DSSA claims check, the markdown and its PNG plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fedge.meter.report import PLOTS, markdown_report, write_report
from fedge.meter.runs import claims_check, load_run, reductions

ROUNDS = 3
CLIENTS = ("agent-0", "agent-1")


def make_run(path: Path, algorithm: str, per_round: dict[str, Any], accuracy: list[float | None]) -> Path:
    """A run directory whose every round has the given totals, split evenly over two agents in clients.jsonl."""
    path.mkdir(parents=True)
    metrics, clients = [], []
    for r in range(1, ROUNDS + 1):
        metrics.append({"round": r, "algorithm": algorithm, "selected": 2, "reported": 2, "dropped": 0,
                        "test_accuracy": accuracy[r - 1], "test_loss": 1.0, "wall_s": 2.0, "agents": 2,
                        **per_round})
        for client in CLIENTS:
            clients.append({"round": r, "client_id": client,
                            **{k: (v / 2 if isinstance(v, int | float) and not isinstance(v, bool) else v)
                               for k, v in per_round.items()},
                            "bytes_payload_down": per_round["bytes_down"] / 2,
                            "bytes_payload_up": per_round["bytes_up"] / 2, "rss_peak_mb": 150.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics))
    (path / "clients.jsonl").write_text("".join(json.dumps(row) + "\n" for row in clients))
    (path / "report.json").write_text(json.dumps({"algorithm": algorithm, "rounds": ROUNDS,
                                                  "final_test_accuracy": accuracy[-1]}))
    return path


ENERGY = {"energy_kind": "measured", "energy_source": "rapl", "energy_scope": "cpu-package"}
FEDAVG = {"bytes_down": 1000, "bytes_up": 1000, "bytes_zmtp_down": 1100, "bytes_zmtp_up": 1100,
          "bytes_tcp_down": 1101, "bytes_tcp_up": 1102, "flops_train": 1000, "flops_fwd_bwd": 800,
          "flops_opt_executed": 200, "flops_opt_updated": 200, "flops_theoretical_sparse": None,
          "energy_j": 50.0, "cpu_s": 4.0, **ENERGY}
DSSA = {"bytes_down": 600, "bytes_up": 400, "bytes_zmtp_down": 650, "bytes_zmtp_up": 450,
        "bytes_tcp_down": None, "bytes_tcp_up": None, "flops_train": 1000, "flops_fwd_bwd": 800,
        "flops_opt_executed": 200, "flops_opt_updated": 60, "flops_theoretical_sparse": 400,
        "energy_j": 40.0, "cpu_s": 3.0, **ENERGY}


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    fedavg = make_run(tmp_path / "fedavg", "fedavg", FEDAVG, [0.3, None, 0.6])
    dssa = make_run(tmp_path / "dssa", "fedavg+dssa", DSSA, [0.25, 0.4, 0.55])
    return fedavg, dssa


def test_reductions_per_figure_and_accounting(runs: tuple[Path, Path]) -> None:
    fedavg, dssa = (load_run(path) for path in runs)
    found = {r.measure.key: r for r in reductions(dssa, fedavg)}
    assert found["comm_payload"].reduction == pytest.approx(0.5)
    assert (found["comm_payload"].value, found["comm_payload"].baseline) == (3000, 6000)
    assert found["comm_payload_down"].reduction == pytest.approx(0.4)
    assert found["comm_payload_up"].reduction == pytest.approx(0.6)
    assert found["comm_zmtp"].reduction == pytest.approx(0.5)
    assert found["comm_tcp"].reduction is None and found["comm_tcp"].note == "figure unknown in some round"
    assert found["compute_executed"].reduction == pytest.approx(0.0)
    assert found["compute_updated"].reduction == pytest.approx(1 - 860 / 1000)
    assert found["compute_theoretical"].reduction == pytest.approx(1 - 460 / 1000)
    assert found["compute_opt_updated"].reduction == pytest.approx(0.7)
    assert found["energy"].reduction == pytest.approx(0.2)
    assert found["cpu"].reduction == pytest.approx(0.25)


def test_claims_check_says_which_accounting_and_whether_it_holds(runs: tuple[Path, Path]) -> None:
    fedavg, dssa = (load_run(path) for path in runs)
    checks = {(c.claim.quantity, c.measure.key): c for c in claims_check(dssa, fedavg)}
    communication = checks[("communication", "comm_payload")]
    assert communication.paper_accounting and communication.holds is False
    assert communication.measured == pytest.approx(0.5)
    assert checks[("communication", "comm_tcp")].holds is None
    computation = checks[("computation", "compute_updated")]
    assert computation.paper_accounting and computation.holds is False
    assert computation.measured == pytest.approx(0.14)
    assert checks[("computation", "compute_theoretical")].holds is True
    assert not checks[("computation", "compute_theoretical")].paper_accounting


def test_energy_of_different_kinds_is_not_compared(tmp_path: Path) -> None:
    fedavg = load_run(make_run(tmp_path / "a", "fedavg", FEDAVG, [0.5] * 3))
    modelled = {**DSSA, "energy_kind": "estimated", "energy_source": "model:cpu-linear", "energy_scope": "board"}
    dssa = load_run(make_run(tmp_path / "b", "fedavg+dssa", modelled, [0.5] * 3))
    energy = next(r for r in reductions(dssa, fedavg) if r.measure.key == "energy")
    assert energy.reduction is None and "refusing to compare" in str(energy.note)


def test_write_report_with_vs(runs: tuple[Path, Path], tmp_path: Path) -> None:
    fedavg, dssa = runs
    out = tmp_path / "out"
    path = write_report(dssa, vs=fedavg, out_dir=out)
    assert path == out / "meter-report.md"
    for name in PLOTS:
        png = out / f"meter-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = path.read_text()
    assert "## Claims check: DSSA paper" in text
    assert "| communication | -73.0 % | encoded payload bytes, down + up (coordinator's count) | -50.0 % | paper | no |" \
        in text
    assert "| computation | -34.9 % |" in text and "| -54.0 % |  | yes |" in text
    assert "| compute_executed | executed: dense fwd+bwd + optimizer on every trainable element | FLOP | 3000 | " \
        "3000 | 0.0 % |  |" in text
    assert "| comm_tcp |" in text and "figure unknown in some round" in text
    assert "| agent-0 | 3 |" in text and "55.00 %" in text


def test_write_report_single_run_defaults_to_the_run_dir(runs: tuple[Path, Path]) -> None:
    fedavg, _ = runs
    path = write_report(fedavg)
    assert path == fedavg / "meter-report.md" and "Claims check" not in path.read_text()
    assert all((fedavg / f"meter-{name}.png").exists() for name in PLOTS)


def test_reversed_order_still_checks_the_dssa_run(runs: tuple[Path, Path]) -> None:
    fedavg, dssa = (load_run(path) for path in runs)
    text = markdown_report(fedavg, dssa)
    assert "Measured reduction of dssa (fedavg+dssa) against fedavg (fedavg)" in text
    assert "| compute_updated | updated-only" in text and "| +16.3 % |" in text  # fedavg costs more than dssa
    assert "Needs exactly one DSSA run" in markdown_report(fedavg, fedavg)


def test_missing_matplotlib_says_how_to_install(runs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install fedge\[report\]"):
        write_report(runs[0])


def test_missing_metrics_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        write_report(tmp_path)
