"""The inspection figure: one panel per layer's statistics, one for EOS probability and the pooled signal.

Drawn with matplotlib's object API on an Agg canvas (no pyplot state, no display needed).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from seer_deploy.calibration.inspection import Inspection
from seer_deploy.core.atomic import write_atomic
from seer_deploy.core.sparsity import STAT_NAMES

_LINE_STYLES = {
    "true end": {"color": "black", "linestyle": "--", "linewidth": 1.6},
    "eos": {"color": "tab:blue", "linestyle": "-", "linewidth": 1.2},
    "sparsity": {"color": "tab:red", "linestyle": "-", "linewidth": 1.2},
    "kept": {"color": "tab:green", "linestyle": ":", "linewidth": 2.0},
}
_STAT_COLORS = ("tab:purple", "tab:orange", "tab:cyan", "tab:gray")


def draw(inspection: Inspection, title: str = "") -> Figure:
    """The figure for one prompt."""
    n_layers = inspection.stats.shape[0]
    G = inspection.gen_length
    fig = Figure(figsize=(11, 1.9 * (n_layers + 1) + 0.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_layers + 1, 1, sharex=True)
    pos = np.arange(G)
    for layer in range(n_layers):
        ax = axes[layer]
        for f, name in enumerate(STAT_NAMES[:-1]):
            ax.plot(pos, inspection.stats[layer, f], color=_STAT_COLORS[f], linewidth=1.0, label=name)
        ax.set_ylabel(f"layer {layer}\nfraction")
        twin = ax.twinx()
        twin.plot(pos, inspection.stats[layer, -1], color=_STAT_COLORS[-1], linewidth=1.0, alpha=0.8,
                  label=STAT_NAMES[-1])
        twin.set_ylabel("mean |h|", color=_STAT_COLORS[-1])
        _marks(ax, inspection)
        if layer == 0:
            handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
            ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=4)
    ax = axes[-1]
    ax.plot(pos, inspection.eos_prob, color="tab:blue", linewidth=1.4, label="step-zero P(EOS)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("P(EOS)")
    ax.set_xlabel("response position")
    twin = ax.twinx()
    twin.plot(pos, inspection.signal, color="tab:red", linewidth=0.9, alpha=0.8, label="pooled sparsity (detrended)")
    twin.set_ylabel("pooled z", color="tab:red")
    _marks(ax, inspection, legend=True)
    b = inspection.boundaries
    fig.suptitle(
        f"{title}  true end {inspection.true_end} | eos {b['eos'].position} | sparsity {b['sparsity'].position} "
        f"(score {b['sparsity'].confidence:.1f}) | {inspection.detector} keeps {inspection.kept[inspection.detector]}"
        f" of {G}",
        fontsize=10,
    )
    return fig


def _marks(ax: Axes, inspection: Inspection, legend: bool = False) -> None:
    """Vertical lines at the true end, each detector's boundary and the kept length."""
    marks = {
        "true end": inspection.true_end,
        "eos": inspection.boundaries["eos"].position,
        "sparsity": inspection.boundaries["sparsity"].position,
        "kept": inspection.kept[inspection.detector],
    }
    for name, where in marks.items():
        if where is not None:
            ax.axvline(where - 0.5, label=f"{name} ({where})", **_LINE_STYLES[name])  # type: ignore[arg-type]
    if legend:
        ax.legend(loc="center right", fontsize=7)


def save_figure(inspection: Inspection, path: str | os.PathLike[str], title: str = "") -> Path:
    """Write the PNG through a temp file renamed into place."""
    fig = draw(inspection, title)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
