"""The llama.cpp comparison's report: the markdown table and the targets, rendered from compare.py's raw JSON.

    .venv/bin/python benchmarks/llama_cpp/report.py benchmarks/results-llama/compare.json   # -> compare.md beside it

compare.py calls `render` after every round; BENCHMARKS.md ("Against llama.cpp") includes the .md it writes.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

GiB = 2**30
# Issue 48's targets, per width: s/step at most this fraction of llama.cpp's at the same width (None: ahead of it),
# peak RSS at most llama.cpp's at the same width plus this (None: no target); first step of an int4 run within 1.5 s.
STEP_TARGET = {"int4": 0.9, "int8": 1.0}
RSS_SLACK = {"fp32": 0.0, "int8": 0.25 * GiB, "int4": 0.25 * GiB}
FIRST_STEP_TARGET_S = {"int4": 1.5}


def git_state(repo: Path) -> str:
    head = subprocess.run(["git", "log", "-1", "--oneline"], capture_output=True, text=True, cwd=repo,
                          check=False).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=repo, check=False).stdout.strip()
    return head + (f" with uncommitted changes ({len(dirty.splitlines())} tracked files modified)" if dirty else "")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        m = re.search(r"Model name:\s*(.+)", out)
        return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor()


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def llama_of(summaries: list[dict[str, Any]], width: str) -> dict[str, Any] | None:
    """llama.cpp's row at this width (f32, q8_0, q4_0), when it ran."""
    return next((s for s in summaries if s["kind"] == "llama" and s.get("width") == width and "step_s" in s), None)


def table(summaries: list[dict[str, Any]]) -> str:
    rows = [("| side | s/step | / llama.cpp same width | all-steps s/step | load s (to step 1) | first step done s | "
             "peak RSS GiB | / llama.cpp same width | weights file GiB | passes |"),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summaries:
        if "step_s" not in s:
            rows.append(f"| {s['name']} | failed: {'; '.join(s.get('errors', []))[:120]} | | | | | | | | |")
            continue
        base = llama_of(summaries, s.get("width", "fp32"))
        step_ratio = f"{s['step_s'] / base['step_s']:.2f}x" if base and s["kind"] == "seer" else "-"
        rss_ratio = f"{s['peak_rss'] / base['peak_rss']:.2f}x" if base and s["kind"] == "seer" else "-"
        rows.append(f"| {s['name']} | {s['step_s']:.3f} | {step_ratio} | {s['avg_step_s']:.3f} | {s['load_s']:.2f} | "
                    f"{fmt(s['first_done_s'], '.2f')} | {s['peak_rss'] / GiB:.2f} | {rss_ratio} | "
                    f"{s['weights_bytes'] / GiB:.2f} | {s['passes'] if s['passes'] is not None else '-'} |")
    return "\n".join(rows)


def targets(summaries: list[dict[str, Any]]) -> list[str]:
    """Issue 48's targets for the seer-deploy rows without the cache, each met or missed by how much."""
    lines = []
    for s in summaries:
        width = s.get("width", "fp32")
        base = llama_of(summaries, width)
        if s["kind"] != "seer" or "step_s" not in s or base is None or "cache" in s["name"]:
            continue
        parts = []
        if width in STEP_TARGET:
            r, goal = s["step_s"] / base["step_s"], STEP_TARGET[width]
            parts.append(f"s/step {r:.2f}x {base['name']}'s vs {'at most' if goal < 1 else 'under'} {goal}x "
                         f"({'met' if r <= goal and (goal < 1 or r < 1) else 'not met'})")
        budget = base["peak_rss"] + RSS_SLACK[width]
        over = s["peak_rss"] - budget
        parts.append(f"peak RSS {s['peak_rss'] / GiB:.2f} GiB vs {budget / GiB:.2f} ({base['name']}'s"
                     + (f" + {RSS_SLACK[width] / GiB:.2f}" if RSS_SLACK[width] else "") + ") "
                     + ("(met)" if over <= 0 else f"(not met by {over / GiB:.2f} GiB)"))
        if width in FIRST_STEP_TARGET_S and s["first_done_s"] is not None:
            goal = FIRST_STEP_TARGET_S[width]
            parts.append(f"first step done after {s['first_done_s']:.2f} s vs {goal} s "
                         f"({'met' if s['first_done_s'] <= goal else 'not met'})")
        lines.append(f"- {s['name']}: " + "; ".join(parts))
    return lines


def render(result: dict[str, Any]) -> str:
    """The markdown of one comparison run, from its raw JSON."""
    shape, summaries = result["shape"], result["summaries"]
    check = result.get("one_step_check", {})
    same = ", ".join(f"{name} {a.get('same_pieces', '?')}/{a['pieces'][0]}" for name, a in check.items()
                     if isinstance(a, dict) and a.get("compared"))
    loads = [x for s in summaries for x in (s.get("loadavg_1min_after") or []) if x is not None]
    return "\n".join([
        (f"{result['date']}, {result['machine']} ({result['cores']} cores), {result['threads']} threads; seer-deploy "
         f"{result['seer_deploy']}; llama.cpp from {result['llama_cpp']}. Command: `{result['command']}`."),
        (f"Model: random LLaDA layout d_model {shape['d_model']}, {shape['n_layers']} layers, MLP {shape['mlp_hidden']}"
         f", vocabulary {shape['vocab']} ({result['params'] / 1e6:.0f}M parameters), prompt "
         f"{len(result['prompt_ids'])} ids (same on both sides: {result['same_prompt_ids']}), gen_length "
         f"{result['gen_length']} in one block, {result['steps']} steps, medians of {result['rounds_done']} of "
         f"{result['rounds']} alternating rounds; 1-minute load average after the runs "
         f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} (2 of it is the run itself)."),
        "",
        table(summaries),
        "",
        *targets(summaries),
        "",
        "Same model on both sides (one step, every position its argmax, llama.cpp's tokens against seer-deploy's at the "
        "same width): " + (same or "not compared"),
    ])


if __name__ == "__main__":
    import json

    source = Path(sys.argv[1])
    source.with_suffix(".md").write_text(render(json.loads(source.read_text())) + "\n")
    print(f"written: {source.with_suffix('.md')}")
