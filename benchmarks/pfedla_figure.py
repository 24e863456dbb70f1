"""The figure of benchmarks/repro_pfedla.py: alpha's heatmaps at the evaluation point and its trajectory.

``plot`` takes the command's traces (alpha [round, client, layer, client], the layer names, the evaluation round,
the guard) and writes one PNG; it computes nothing the report does not already hold. Imports numpy, matplotlib
(through ``_repro_common.pyplot``) and the criterion module; no torch, no Fedge.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _repro_common import pyplot

from fedge.sweep import pfedla_criterion as criterion


def plot(trace: Any, others: Sequence[Any], overlap: np.ndarray, path: Path, title: str) -> None:
    plt = pyplot()
    clients = trace.alpha.shape[1]
    columns = 2 + len(trace.layers)
    figure, axes = plt.subplots(1, columns, figsize=(3.3 * columns, 3.4),
                                gridspec_kw={"width_ratios": [1.3] + [1.0] * len(trace.layers) + [1.4]})
    at = trace.alpha[trace.evaluated_round]
    panels = [("mean over layers", at.mean(axis=1))] + [(name, at[:, li]) for li, name in enumerate(trace.layers)]
    mean = panels[0][1]
    low, top = float(mean.min()), float(mean.max())
    per_layer = (min(float(m.min()) for _, m in panels[1:]), max(float(m.max()) for _, m in panels[1:]))
    for position, (ax, (name, matrix)) in enumerate(zip(axes, panels, strict=False)):
        scale = (low, top) if position == 0 else per_layer
        image = ax.imshow(matrix, cmap="viridis", vmin=scale[0], vmax=scale[1])
        ax.set_title(f"α, {name}", fontsize=9)
        ax.set_xticks(range(clients))
        ax.set_yticks(range(clients))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("client j (weight given to)", fontsize=8)
        if position in (0, len(panels) - 1):
            figure.colorbar(image, ax=ax, fraction=0.046).ax.tick_params(labelsize=7)
    axes[0].set_ylabel("client i (row)", fontsize=8)
    for i in range(clients):
        for j in range(clients):
            colour = "black" if mean[i, j] > low + 0.6 * (top - low) else "white"
            axes[0].text(j, i, f"{mean[i, j]:.3f}", ha="center", va="center", fontsize=5, color=colour)
    ax = axes[-1]
    for run_trace, style in ((trace, "-"), *((t, ":") for t in others if t.guard)):
        series = np.array([criterion.relation_means(a.mean(axis=1), overlap) for a in run_trace.alpha])
        for column, (name, colour) in enumerate((("3 shared", "tab:orange"), ("2", "tab:olive"),
                                                 ("1", "tab:cyan"), ("0", "tab:blue"), ("self", "tab:red"))):
            tag = "" if run_trace is trace else " (guard)"
            ax.plot(np.arange(len(series)), series[:, column], style, color=colour, label=f"{name}{tag}",
                    linewidth=1.0)
    ax.axhline(criterion.FORMED_SELF_FACTOR / clients, color="grey", linewidth=0.7, linestyle="--")
    ax.axvline(trace.evaluated_round, color="grey", linewidth=0.7)
    ax.set_title("mean α by classes shared", fontsize=9)
    ax.set_xlabel("round", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=5, ncol=2)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
