"""The bench figure, drawn from the bench JSON: speedup against gen_length per row (one panel per batch size) and,
when the cost-scaling workload ran, step time against sequence length per backend.

matplotlib's object API on an Agg canvas: no pyplot state and no display needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from seer_deploy.core.atomic import write_atomic

_STYLE = {
    "reference": {"color": "black", "marker": "o"},
    "ort-full": {"color": "tab:blue", "marker": "s"},
    "ort-seer": {"color": "tab:red", "marker": "^"},
    "ort-parallel": {"color": "tab:cyan", "marker": "s", "linestyle": ":"},
    "ort-fastdllm": {"color": "tab:olive", "marker": "P"},
    "ort-seer-fast": {"color": "crimson", "marker": "*"},
    "ort-seer-tail": {"color": "tab:brown", "marker": "^", "linestyle": ":"},
    "ort-oracle": {"color": "tab:green", "marker": "v", "linestyle": "--"},
    "torch-seer": {"color": "tab:orange", "marker": "D"},
    "trt-full": {"color": "tab:purple", "marker": "s"},
    "trt-seer": {"color": "tab:pink", "marker": "^"},
}


def draw(data: dict[str, Any]) -> Figure:
    rows: list[dict[str, Any]] = data["rows"]
    batch_sizes = sorted({r["batch_size"] for r in rows})
    scaling = data.get("scaling")
    panels = len(batch_sizes) + (1 if scaling else 0)
    fig = Figure(figsize=(5.2 * panels, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax, batch in zip(axes, batch_sizes, strict=False):
        names = list(dict.fromkeys(r["row"] for r in rows))
        for name in names:
            points = sorted((r["gen_length"], r["speedup"]) for r in rows if r["row"] == name and r["batch_size"] == batch)
            ax.plot([g for g, _ in points], [s for _, s in points], label=name, **_STYLE.get(name, {}))
        gens = sorted({r["gen_length"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xticks(gens, [str(g) for g in gens])
        ax.set_xlabel("gen_length")
        ax.set_ylabel("speedup against the torch reference (x)")
        ax.set_title(f"batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if scaling:
        ax = axes[-1]
        points = scaling["points"]
        for backend in dict.fromkeys(p["backend"] for p in points):
            mine = sorted((p["seq_len"], p["ms"]) for p in points if p["backend"] == backend)
            ax.plot([n for n, _ in mine], [ms for _, ms in mine], marker="o", label=backend)
        lengths = sorted({p["seq_len"] for p in points})
        s = scaling["settings"]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("sequence length (positions per step)")
        ax.set_ylabel("ms per denoising step")
        ax.set_title(f"random LLaDA-shaped model, d {s['d_model']}, {s['n_layers']} layers, batch {s['batch']}",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def write_plot(data: dict[str, Any], path: Path) -> Path:
    fig = draw(data)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"))
