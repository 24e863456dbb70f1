"""``write_report``: a markdown report with PNG plots for one run directory, optionally compared against another.

Plots: accuracy against round, cumulative bytes against round, FLOPs and energy per round, and a per-agent
breakdown. With ``vs``, a table of reductions per figure and per accounting, and, when one run is DSSA and the other
dense, the claims check against the DSSA paper (communication -73.0 %, computation -34.9 %). matplotlib is imported
lazily through its object API (no pyplot, no global backend change). Numbers come from ``meter.runs``; this module
only lays them out. Must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedge.meter.runs import (
    BY_KEY,
    CLAIMS,
    MEASURES,
    Run,
    claims_check,
    energy_label,
    is_sparse_run,
    load_run,
    per_agent,
    reductions,
    total,
)

PLOTS = ("accuracy", "bytes", "compute_energy", "agents")
PRIVACY_PLOT = "privacy"  # written when a run is differentially private (docs/privacy.md)


def is_private(run: Run) -> bool:
    return any(row.get("epsilon") is not None for row in run.metrics)


def write_report(run_dir: str | Path, vs: str | Path | None = None, out_dir: str | Path | None = None) -> Path:
    """Write ``meter-report.md`` and ``meter-<plot>.png`` into ``out_dir`` (default ``run_dir``); return the
    markdown's path. ``vs`` is a second run directory to compare against (the baseline)."""
    figure_class = _matplotlib_figure()
    run = load_run(run_dir)
    other = load_run(vs) if vs is not None else None
    out = Path(out_dir) if out_dir is not None else run.path
    out.mkdir(parents=True, exist_ok=True)
    runs = [run] + ([other] if other else [])
    _plot_accuracy(figure_class, runs, out / "meter-accuracy.png")
    _plot_bytes(figure_class, runs, out / "meter-bytes.png")
    _plot_compute_energy(figure_class, runs, out / "meter-compute_energy.png")
    _plot_agents(figure_class, run, out / "meter-agents.png")
    if any(is_private(r) for r in runs):
        _plot_privacy(figure_class, runs, out / f"meter-{PRIVACY_PLOT}.png")
    path = out / "meter-report.md"
    path.write_text(markdown_report(run, other))
    return path


def _matplotlib_figure() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("the meter report needs matplotlib: pip install fedge[report]") from error
    return Figure


def _label(run: Run) -> str:
    return f"{run.name} ({run.algorithm})"


def _series(run: Run, name: str) -> tuple[list[int], list[float | None]]:
    return [int(row.get("round", i)) for i, row in enumerate(run.metrics)], [row.get(name) for row in run.metrics]


def _plot_accuracy(figure_class: Any, runs: list[Run], path: Path) -> None:
    fig = figure_class(figsize=(6, 3.6))
    axes = fig.add_subplot()
    for run in runs:
        rounds, values = _series(run, "test_accuracy")
        points = [(r, 100 * v) for r, v in zip(rounds, values, strict=True) if v is not None]
        if points:
            axes.plot(*zip(*points, strict=True), marker=".", label=_label(run))
    axes.set(xlabel="round", ylabel="test accuracy (%)", title="Accuracy")
    _finish(fig, axes, path)


def _plot_privacy(figure_class: Any, runs: list[Run], path: Path) -> None:
    """Epsilon spent against rounds (at each run's delta), with the clip on a second axis."""
    fig = figure_class(figsize=(6, 3.6))
    axes = fig.add_subplot()
    clips = axes.twinx()
    for color, run in zip(("C0", "C1"), runs, strict=False):
        rounds, epsilons = _series(run, "epsilon")
        points = [(r, v) for r, v in zip(rounds, epsilons, strict=True) if v is not None]
        if points:
            axes.plot(*zip(*points, strict=True), marker=".", color=color, label=f"{_label(run)} epsilon")
        rounds, clip = _series(run, "clip")
        points = [(r, v) for r, v in zip(rounds, clip, strict=True) if v is not None]
        if points:
            clips.plot(*zip(*points, strict=True), ":", color=color, label=f"{_label(run)} clip")
    axes.set(xlabel="round", ylabel="epsilon spent", title="Privacy")
    clips.set(ylabel="clip (L2)")
    if clips.has_data():
        clips.legend(fontsize=7, loc="lower right")
    axes.legend(fontsize=7, loc="upper left")
    _finish(fig, axes, path)


def _cumulative(values: list[float | None]) -> list[float] | None:
    if any(v is None for v in values):
        return None
    running, result = 0.0, []
    for value in values:
        running += float(value or 0)
        result.append(running)
    return result


def _plot_bytes(figure_class: Any, runs: list[Run], path: Path) -> None:
    fig = figure_class(figsize=(6, 3.6))
    axes = fig.add_subplot()
    for color, run in zip(("C0", "C1"), runs, strict=False):
        rounds = [int(row.get("round", i)) for i, row in enumerate(run.metrics)]
        for key, style, what in (("comm_payload", "-", "payload"), ("comm_zmtp", "--", "ZMTP")):
            cumulative = _cumulative([BY_KEY[key].per_round(row) for row in run.metrics])
            if cumulative:
                axes.plot(rounds, [v / 1e6 for v in cumulative], style, color=color, label=f"{_label(run)} {what}")
    axes.set(xlabel="round", ylabel="cumulative MB (down + up)", title="Communication")
    _finish(fig, axes, path)


def _plot_compute_energy(figure_class: Any, runs: list[Run], path: Path) -> None:
    fig = figure_class(figsize=(10, 3.6))
    flops_axes, energy_axes = fig.subplots(1, 2)
    for color, run in zip(("C0", "C1"), runs, strict=False):
        rounds = [int(row.get("round", i)) for i, row in enumerate(run.metrics)]
        for key, style, what in (("compute_executed", "-", "executed"), ("compute_updated", "--", "updated-only")):
            values = [BY_KEY[key].per_round(row) for row in run.metrics]
            if all(v is not None for v in values):
                flops_axes.plot(rounds, [(v or 0) / 1e9 for v in values], style, color=color,
                                label=f"{_label(run)} {what}")
        label = energy_label(run)
        energies = [row.get("energy_j") for row in run.metrics]
        if not isinstance(label, str) and all(v is not None for v in energies):
            energy_axes.plot(rounds, energies, marker=".", color=color,
                             label=f"{_label(run)} [{label[0]}, {label[2]}]")
    flops_axes.set(xlabel="round", ylabel="GFLOP per round", title="Computation")
    energy_axes.set(xlabel="round", ylabel="J per round", title="Energy")
    _finish(fig, flops_axes, path, extra=energy_axes)


def _plot_agents(figure_class: Any, run: Run, path: Path) -> None:
    agents = per_agent(run)
    fig = figure_class(figsize=(12, 3.6))
    panels = fig.subplots(1, 4)
    names = [agent["client_id"] for agent in agents]
    for axes, (title, keys, scale) in zip(panels, (
            ("payload MB (down + up)", ("bytes_payload_down", "bytes_payload_up"), 1e6),
            ("GFLOP executed", ("flops_train",), 1e9), ("energy J", ("energy_j",), 1.0),
            ("CPU s", ("cpu_s",), 1.0)), strict=True):
        values = [None if any(agent[k] is None for k in keys) else sum(agent[k] for k in keys) for agent in agents]
        axes.bar(names, [0.0 if v is None else v / scale for v in values])
        axes.set_title(title, fontsize=9)
        axes.tick_params(axis="x", labelrotation=90, labelsize=7)
    fig.suptitle(f"Per agent, summed over rounds: {_label(run)} (a missing figure shows as 0)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _finish(fig: Any, axes: Any, path: Path, extra: Any = None) -> None:
    from matplotlib.ticker import MaxNLocator

    for each in (axes, extra):
        if each is None:
            continue
        if each.has_data():
            each.legend(fontsize=7)
        each.grid(alpha=0.3)
        each.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1e4:
        return f"{value:,.0f}{unit}"
    return f"{value:.4g}{unit}"


def _percent(value: float | None) -> str:
    if value is None:
        return "n/a"
    change = -100 * value
    return "0.0 %" if round(change, 1) == 0 else f"{change:+.1f} %"


def markdown_report(run: Run, other: Run | None = None) -> str:
    """The report's markdown for loaded runs (the plots it links are written by ``write_report``)."""
    lines = [f"# Meter report: {_label(run)}" + (f" vs {_label(other)}" if other else ""), ""]
    lines += ["Figures are totals over all rounds. Every figure states its accounting; reductions are computed only "
              "between figures of the same accounting (energy: same kind, source and scope). See docs/meter.md.",
              "", "## Runs", "", "| | " + " | ".join(_label(r) for r in [run] + ([other] if other else [])) + " |",
              "|---|" + "---|" * (2 if other else 1)]
    summaries = [_summary(r) for r in [run] + ([other] if other else [])]
    for title in summaries[0]:
        lines.append(f"| {title} | " + " | ".join(summary[title] for summary in summaries) + " |")
    lines += ["", "## Totals" + (" and reductions" if other else ""), ""]
    if other:
        lines += [f"Reduction = (baseline - run) / baseline, shown as a change of {run.name} against {other.name}.",
                  "", "| figure | accounting | unit | run | baseline | change | note |", "|---|---|---|---|---|---|---|"]
        for result in reductions(run, other):
            m = result.measure
            lines.append(f"| {m.key} | {m.accounting} | {m.unit} | {_number(result.value)} | "
                         f"{_number(result.baseline)} | {_percent(result.reduction)} | {result.note or ''} |")
        lines += _claims_section(run, other)
    else:
        lines += ["| figure | accounting | unit | total |", "|---|---|---|---|"]
        lines += [f"| {m.key} | {m.accounting} | {m.unit} | {_number(total(run, m))} |" for m in MEASURES]
    lines += ["", f"## Per agent: {_label(run)}", "",
              "| agent | rounds | payload B down | payload B up | ZMTP B down | ZMTP B up | FLOP executed | "
              "energy J | CPU s | peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for a in per_agent(run):
        lines.append(f"| {a['client_id']} | {a['rounds']} | " + " | ".join(_number(a[k]) for k in (
            "bytes_payload_down", "bytes_payload_up", "bytes_zmtp_down", "bytes_zmtp_up", "flops_train",
            "energy_j", "cpu_s", "rss_peak_mb")) + " |")
    plots = [*PLOTS, *([PRIVACY_PLOT] if any(is_private(r) for r in [run, *([other] if other else [])]) else [])]
    lines += ["", "## Plots", ""] + [f"![{name}](meter-{name}.png)" for name in plots]
    return "\n".join(lines) + "\n"


def _summary(run: Run) -> dict[str, str]:
    label = energy_label(run)
    return {"rounds": str(len(run.metrics)), "final test accuracy": _final_accuracy(run),
            "energy label": label if isinstance(label, str) else ", ".join(label)}


def _final_accuracy(run: Run) -> str:
    value = run.summary.get("final_test_accuracy")
    if value is None:
        known = [row["test_accuracy"] for row in run.metrics if row.get("test_accuracy") is not None]
        value = known[-1] if known else None
    return "n/a" if value is None else f"{100 * value:.2f} %"


def _claims_section(run: Run, other: Run) -> list[str]:
    lines = ["", "## Claims check: DSSA paper", ""]
    sparse = [r for r in (run, other) if is_sparse_run(r)]
    if len(sparse) != 1:
        return lines + ["Needs exactly one DSSA run and one dense baseline run; not applicable here."]
    dssa, baseline = (run, other) if sparse[0] is run else (other, run)
    lines += [f"Measured reduction of {_label(dssa)} against {_label(baseline)}, beside the paper's claim. A claim "
              "holds when the measured reduction, rounded to 0.1 point, is at least the claimed one. The row marked "
              "'paper' uses the accounting the paper's figure is closest to.", ""]
    if baseline.algorithm.lower() != "fedavg":
        lines += [f"Note: the paper's baseline is FedAvg; this baseline is {baseline.algorithm}.", ""]
    lines += ["| claim | claimed | accounting | measured | paper's accounting | holds | note |",
              "|---|---|---|---|---|---|---|"]
    for check in claims_check(dssa, baseline):
        holds = "n/a" if check.holds is None else ("yes" if check.holds else "no")
        lines.append(f"| {check.claim.quantity} | {-100 * check.claim.claimed:+.1f} % | {check.measure.accounting} | "
                     f"{_percent(check.measured)} | {'paper' if check.paper_accounting else ''} | {holds} | "
                     f"{check.note or ''} |")
    lines += ["", *[f"- {claim.quantity}: {claim.why}." for claim in CLAIMS],
              "- As docs/algorithms.md section 4.7 explains, DSSA as described moves about one model per agent per sparse "
              "round against two for dense FedAvg, so its lossless byte cut is bounded near 50 %; a larger measured "
              "cut comes from lossy or uplink-sparsification options, whose accuracy cost belongs beside it."]
    return lines
