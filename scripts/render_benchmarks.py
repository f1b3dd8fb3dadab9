"""Render BENCHMARKS.md from the committed benchmark results (no measuring here).

    seer-deploy bench demo --gen-lengths 64,256 --batch-sizes 1,8 --prompts 8 --repeats 3 --threads 1 \
        --scaling-lengths 256,512,1024,2048 --out benchmarks/results-fast        # the fast rows (issue 22)
    seer-deploy bench --tail-context 0 --out benchmarks/results                   # bench.json, bench.md, bench.png
    seer-deploy bench demo-vl --no-scaling --out benchmarks/results-vl            # the multimodal workload
    python benchmarks/bench_loopcore.py > benchmarks/results/loopcore.md
    python benchmarks/bench_step_latency.py --threads 2 > benchmarks/results/step_latency.md
    python benchmarks/bench_hybrid.py --threads 2 > benchmarks/results/hybrid.md
    python benchmarks/compare_runs.py BEFORE/bench.json AFTER/bench.json > benchmarks/results/redesign_check.md
    PYTHONPATH=. python benchmarks/quant_memory.py demo; ... llada --layers 1; ... --render   # memory, issue 31
    PYTHONPATH=. python scripts/gpu_check.py --out benchmarks/results-gpu/gpu_check.json   # on a GPU machine
    seer-deploy eval demo --tasks demo --modes all --threads 1 --json benchmarks/results-eval/demo.json
    seer-deploy eval demo-vl --tasks demo_vl --modes full,seer,seer-tail --gen-length 32 --threads 1 \
        --json benchmarks/results-eval/demo-vl.json                               # accuracy in every mode
    seer-deploy eval demo-vl --harness lmms-eval --tasks demo_vl --modes all --gen-length 32 --tail-context 0 \
        --threads 1 --json benchmarks/results-eval/demo-vl-lmms.json              # the same through lmms-eval
    PYTHONPATH=. python benchmarks/quant_study.py --out benchmarks/results-quant  # Seer on int8 / int4 weights
    seer-deploy bench demo --gen-lengths 64 --batch-sizes 8 --prompts 8 --repeats 3 --no-scaling --no-tensorrt \
        --quantize none --rules dream,lavida-dream,dimple,dimple-confident --out benchmarks/results-rules
    PYTHONPATH=. python benchmarks/dimple_pictures.py vision|bench|render        # Dimple with pictures (issue 44)
    python benchmarks/llama_cpp/compare.py --rounds 2 --results benchmarks/results-llama   # issue 48
    python benchmarks/memory_breakdown.py EXPORTS --out benchmarks/results-footprint/breakdown.json; ... --render
    python benchmarks/memory_pattern.py EXPORT --rounds 4 --out benchmarks/results-footprint/memory_pattern.json
    PYTHONPATH=. python benchmarks/bench_prompt_cache.py --prompts 8 --rounds 3    # the prompt cache per family rule
    python scripts/render_benchmarks.py                                           # -> BENCHMARKS.md

The first part is the run with the fast rows (parallel decoding, the KV cache: benchmarks/results-fast, with its
notes.md), then `seer_deploy.bench.report.render_markdown` of bench.json, then notes.md (the analysis written for
that run: why a target is missed), then the multimodal bench rendered the same way; the scripts' tables follow, each
under the command that produced it. A missing script output is named as missing, not skipped silently.
"""

from __future__ import annotations

import json
from pathlib import Path

from seer_deploy.bench.report import render_markdown
from seer_deploy.core.atomic import write_atomic

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_VL = ROOT / "benchmarks" / "results-vl"
RESULTS_FAST = ROOT / "benchmarks" / "results-fast"
RESULTS_GPU = ROOT / "benchmarks" / "results-gpu"  # scripts/gpu_check.py: gpu_check.md (from a GPU run), notes.md
RESULTS_SERVE = ROOT / "benchmarks" / "results-serve"  # benchmarks/load_generator.py: notes.md
RESULTS_TRT = ROOT / "benchmarks" / "results-trt"  # benchmarks/trt_build_cost.py's table and its reading: notes.md
RESULTS_LLAMA = ROOT / "benchmarks" / "results-llama"  # benchmarks/llama_cpp/compare.py's run: notes.md, compare.md
RESULTS_FOOTPRINT = ROOT / "benchmarks" / "results-footprint"  # benchmarks/memory_breakdown.py: notes.md, table.md
RESULTS_SCALE = ROOT / "benchmarks" / "results-scale"  # benchmarks/scale_export.py's runs: notes.md and the JSON
RESULTS_EVAL = ROOT / "benchmarks" / "results-eval"  # eval --json: demo.md, demo-vl.md, demo-vl-lmms.md; notes.md
RESULTS_QUANT = ROOT / "benchmarks" / "results-quant"  # benchmarks/quant_study.py: quant_study.md, the JSON; notes.md
RESULTS_QUANT_BENCH = ROOT / "benchmarks" / "results-quant-bench"  # seer-deploy bench --quantize int8,int4: notes.md
RESULTS_DECIDE_ONCE = ROOT / "benchmarks" / "results-decide-once"  # issue 43: bench before / after, compare.md
RESULTS_EXPORT_CHECK = ROOT / "benchmarks" / "results-export-check"  # benchmarks/export_check.py: figures.json
RESULTS_QUANT_MEMORY = ROOT / "benchmarks" / "results-quant-memory"  # benchmarks/quant_memory.py: table.md; notes.md
RESULTS_RULES = ROOT / "benchmarks" / "results-rules"  # seer-deploy bench --rules ...: bench.json; notes.md
RESULTS_DIMPLE = ROOT / "benchmarks" / "results-dimple"  # benchmarks/dimple_pictures.py: vision-cost.md, bench/; notes.md
RESULTS_PROMPT_CACHE = ROOT / "benchmarks" / "results-prompt-cache"  # bench_prompt_cache.py: prompt_cache.md; notes.md
# How a table names its source (tests/test_benchmarks_sources.py walks them): a line `<!-- source: PATH[, PATH] -->`
# (JSON or CSV files under benchmarks/results*/) or `<!-- not reproducible from a raw file: WHY -->`, after the
# heading the table sits under; it holds until the next heading. Generated parts get it from `sourced`; hand-written
# notes carry their own.
BEFORE_AFTER = "the two runs' bench.json files were not committed"
SCRIPTS = (
    ("loopcore.md", "Runtime loop host time per step: C core against the numpy twin",
     "python benchmarks/bench_loopcore.py", "the script prints markdown, no raw file"),
    ("step_latency.md", "Step latency: ONNX Runtime (CPU) against torch eager at S = prompt + kept length",
     "python benchmarks/bench_step_latency.py --threads 2", "the script prints markdown, no raw file"),
    ("hybrid.md", "Batch throughput after Seer's cut: hybrid execution against padding to the longest and one by one",
     "python benchmarks/bench_hybrid.py --threads 2", "the script prints markdown, no raw file"),
    ("issues23_25_check.md", "Issues 23-25 (GPU path, serving, model families): the same bench before and after",
     ("seer-deploy bench demo --gen-lengths 64 --batch-sizes 1,8 --prompts 8 --repeats 3 --threads 1 --no-scaling "
      "--no-tensorrt --out DIR, at c69385e and at c222a3d (one after the other, 2-core Xeon), then "
      "python benchmarks/compare_runs.py BEFORE/bench.json AFTER/bench.json --labels c69385e,c222a3d"),
     BEFORE_AFTER),
    ("issues32_39_check.md", ("Issues 32-39 (streamed export, checkpoints as shipped, the server under faults, eval, "
                              "open once): the same bench before and after"),
     ("seer-deploy bench demo --gen-lengths 64 --batch-sizes 1,8 --prompts 8 --repeats 1 --threads 1 --no-scaling "
      "--no-tensorrt --out DIR, at c8da7a1 and at d62948c (side by side with the test suite on the 2-core Xeon, "
      "2026-12-06: the seconds are not comparable, the passes, tokens and answers are), then "
      "python benchmarks/compare_runs.py BEFORE/bench.json AFTER/bench.json --labels c8da7a1,d62948c"),
     BEFORE_AFTER),
    ("issue37_check.md", "Issues 37 and 30 (one step graph, weights once): the same bench before and after",
     ("seer-deploy bench demo --gen-lengths 64 --batch-sizes 1,8 --prompts 8 --repeats 3 --threads 1 --no-scaling "
      "--no-tensorrt --out DIR, at 83bf335 and at 78fea59 (one after the other, 2-core Xeon, 2026-12-06), then "
      "python benchmarks/compare_runs.py BEFORE/bench.json AFTER/bench.json --labels 83bf335,HEAD"),
     BEFORE_AFTER),
    ("step_graph.md", "One step graph for every pass (issues 37, 30): a pass with and without the work it can skip",
     "python benchmarks/step_graph_cost.py EXPORT --prompt 32 --response 256 --masked 128 --threads 2 --repeats 5",
     "the script prints markdown, no raw file; its export was not kept"),
    ("redesign_check.md", "The core redesign (issue 20): the same bench before and after, on one machine",
     ("seer-deploy bench demo --gen-lengths 64,256 --batch-sizes 1,8 --prompts 8 --repeats 3 --threads 0 --no-scaling "
      "--tail-context 0 --no-tensorrt --out DIR, at a47acab and after the redesign, then "
      "python benchmarks/compare_runs.py BEFORE/bench.json AFTER/bench.json --labels a47acab,redesign"),
     BEFORE_AFTER),
)


def sourced(text: str, source: str) -> str:
    """`text` with the marker of `source` (comma-separated paths, or 'not reproducible from a raw file: WHY')
    at its top and after each of its headings."""
    marker = f"<!-- {source} -->" if source.startswith("not reproducible") else f"<!-- source: {source} -->"
    lines = [marker]
    for line in text.splitlines():
        lines.append(line)
        if line.startswith("#"):
            lines.append(marker)
    return "\n".join(lines)


def main() -> None:
    text = render()
    write_atomic(ROOT / "BENCHMARKS.md", lambda p: p.write_text(text))
    print(f"wrote {ROOT / 'BENCHMARKS.md'}")


def render() -> str:
    """BENCHMARKS.md's text from the committed results."""
    parts: list[str] = []
    fast = RESULTS_FAST / "bench.json"
    if fast.is_file():
        fast_notes = RESULTS_FAST / "notes.md"
        rendered = render_markdown(json.loads(fast.read_text()), "benchmarks/results-fast/bench.png")
        title, _, body = rendered.partition("\n")
        parts += [sourced(f"{title}, with the fast rows (parallel decoding, KV cache, progressive step zero)\n{body}",
                          "benchmarks/results-fast/bench.json"),
                  fast_notes.read_text().strip() if fast_notes.is_file() else "", ""]
    data = json.loads((RESULTS / "bench.json").read_text())
    notes = RESULTS / "notes.md"  # hand-written analysis of this run (why a target is missed), kept beside the JSON
    parts += [sourced(render_markdown(data, "benchmarks/results/bench.png"), "benchmarks/results/bench.json"),
              notes.read_text().strip() if notes.is_file() else "", ""]
    vl = RESULTS_VL / "bench.json"
    parts += [sourced(render_markdown(json.loads(vl.read_text()), "benchmarks/results-vl/bench.png"),
                      "benchmarks/results-vl/bench.json") if vl.is_file()
              else "# seer-deploy bench: demo-vl\n\n(not measured: benchmarks/results-vl/bench.json is missing)", ""]
    parts += ["# Accuracy in every mode: seer-deploy eval (lm-evaluation-harness, lmms-eval)", ""]
    for name in ("notes.md", "demo.md", "demo-vl.md", "demo-vl-lmms.md"):  # the notes, then each table under its command
        path = RESULTS_EVAL / name
        raw = f"benchmarks/results-eval/{path.stem}.json"
        parts += [(path.read_text().strip() if name == "notes.md" else sourced(path.read_text().strip(), raw))
                  if path.is_file() else f"(not measured: benchmarks/results-eval/{name} is missing)", ""]
    parts += ["# GPU: scripts/gpu_check.py", ""]
    for name in ("notes.md", "gpu_check.md"):
        path = RESULTS_GPU / name
        parts += [path.read_text().strip() if path.is_file() else f"(no GPU run recorded: benchmarks/results-gpu/{name} "
                  "is missing)", ""]
    parts += ["# Seer on quantized weights: benchmarks/quant_study.py", ""]
    for name in ("notes.md", "quant_study.md"):  # the reading, then the script's tables
        path = RESULTS_QUANT / name
        text = path.read_text().strip() if path.is_file() else ""
        if name == "quant_study.md":
            text = sourced(text, "benchmarks/results-quant/demo.json, benchmarks/results-quant/demo-vl.json")
        parts += [text or f"(not measured: benchmarks/results-quant/{name} is missing)", ""]
    parts += _section("Export at scale: LLaDA-8B's shape on this machine", RESULTS_SCALE / "notes.md")
    parts += _section("Memory: weight-only int8 and int4 exports (issue 31)", RESULTS_QUANT_MEMORY / "notes.md")
    table = RESULTS_QUANT_MEMORY / "table.md"  # benchmarks/quant_memory.py --render, from the JSON beside it
    memory_raw = "benchmarks/results-quant-memory/demo.json, benchmarks/results-quant-memory/llada-d4096-l1-m12288-h32-v126464.json"
    parts += [sourced(table.read_text().strip(), memory_raw) if table.is_file() else f"(not measured: {table} is "
              "missing)", ""]
    quant_bench = RESULTS_QUANT_BENCH / "bench.json"  # the bench with its ort-int8 / ort-int4 rows, and its reading
    if quant_bench.is_file():
        rendered = render_markdown(json.loads(quant_bench.read_text()), "benchmarks/results-quant-bench/bench.png")
        title, _, body = rendered.partition("\n")
        parts += [f"{title}, with the quantized rows (issue 31)", (RESULTS_QUANT_BENCH / "notes.md").read_text().strip(),
                  sourced(body, "benchmarks/results-quant-bench/bench.json"), ""]
    rules = RESULTS_RULES / "bench.json"  # the bench with the Dream family's rules (issue 45), and its reading
    if rules.is_file():
        rendered = render_markdown(json.loads(rules.read_text()), "benchmarks/results-rules/bench.png")
        title, _, body = rendered.partition("\n")
        parts += [f"{title}, with the Dream family's decoding rules (issue 45)",
                  (RESULTS_RULES / "notes.md").read_text().strip(), sourced(body, "benchmarks/results-rules/bench.json"),
                  ""]
    parts += _section("Dimple with pictures (issue 44)", RESULTS_DIMPLE / "notes.md")
    cost, dimple = RESULTS_DIMPLE / "vision-cost.md", RESULTS_DIMPLE / "bench" / "bench.json"
    parts += [sourced(cost.read_text().strip(), "benchmarks/results-dimple/vision-cost-depth4.json") if cost.is_file()
              else f"(not measured: {cost} is missing)", "",
              sourced(render_markdown(json.loads(dimple.read_text()), "benchmarks/results-dimple/bench/bench.png"),
                      "benchmarks/results-dimple/bench/bench.json")
              if dimple.is_file() else f"(not measured: {dimple} is missing)", ""]
    parts += _section("The prompt cache per family and rule, with pictures (issue 45)", RESULTS_PROMPT_CACHE / "notes.md")
    parts += _rendered(RESULTS_PROMPT_CACHE / "prompt_cache.md", "benchmarks/results-prompt-cache/prompt_cache.json")
    parts += _export_check()
    parts += _section("Decide once, name once: the bench before and after (issue 43)", RESULTS_DECIDE_ONCE / "notes.md")
    parts += _rendered(RESULTS_DECIDE_ONCE / "compare.md", "benchmarks/results-decide-once/before/bench.json, "
                       "benchmarks/results-decide-once/after/bench.json")
    parts += _rendered(RESULTS_DECIDE_ONCE / "compare-final.md", "benchmarks/results-decide-once/before/bench.json, "
                       "benchmarks/results-decide-once/final/bench.json")
    parts += _section("TensorRT-RTX builds", RESULTS_TRT / "notes.md")
    serve = RESULTS_SERVE / "notes.md"
    parts += ["# Serving: seer-deploy serve under load", "",
              serve.read_text().strip() if serve.is_file() else "(not measured: benchmarks/results-serve/notes.md is "
              "missing)", ""]
    parts += ["# Component benchmarks", "",
              "Run on the same machine as the bench above, one at a time (the notes above say which were rerun with it).",
              ""]
    for name, title, command, why in SCRIPTS:
        parts += [f"## {title}", "", f"<!-- not reproducible from a raw file: {why} -->", "", f"Command: `{command}`", ""]
        path = RESULTS / name
        parts += [path.read_text().strip() if path.is_file() else f"(not measured: {path.name} is missing)", ""]
    parts += _section("Against llama.cpp", RESULTS_LLAMA / "notes.md")
    parts += _rendered(RESULTS_LLAMA / "compare.md", "benchmarks/results-llama/compare.json")  # benchmarks/llama_cpp/report.py, from compare.json beside it
    parts += _section("The quantized edge footprint: memory and first step, component by component (issue 48)",
                      RESULTS_FOOTPRINT / "notes.md")
    parts += _rendered(RESULTS_FOOTPRINT / "table.md", ", ".join(
        str(p.relative_to(ROOT)) for p in sorted(RESULTS_FOOTPRINT.glob("breakdown*.json"))))  # benchmarks/memory_breakdown.py --render, from its JSON
    return "\n".join(parts)


def _export_check() -> list[str]:
    """The quantized export's check on honest exports and on the issue's noise graph, from its JSON."""
    path = RESULTS_EXPORT_CHECK / "figures.json"
    title = "# The quantized export's check: honest exports and a graph of noise (issue 47)"
    if not path.is_file():
        return [title, "", f"(not measured: {path.relative_to(ROOT)} is missing)", ""]
    data = json.loads(path.read_text())
    lines = [title, "", f"<!-- source: {path.relative_to(ROOT)} -->", "",
             (f"Command: `{data['command']}` (at {data['commit']}, {data['date']}; {data['machine']}). Each export's "
              "own check (manifest.json, validation); the bounds are in README.md, \"Smaller weights\"."), "",
             *([] if data.get("complete") else [
                 ("The run was stopped before the end of its list (the session's time): the exports below are what it "
                 "measured; the honest int4, demo-vl and family-checkpoint exports were not measured in it."), ""]),
             "| export | verdict | KL share | top-10 overlap | token agreement | logit error vs the scheme in torch |",
             "|---|---|---|---|---|---|"]
    for run in data["runs"]:
        f = run["max_diff"]
        lines.append(f"| {run['export']} | {'verified' if run['verified'] else '**refused**'} | "
                     f"{f['kl share (mean)']:.4f} | {f['top-10 overlap (mean)']:.3f} | {f['token agreement']:.3f} | "
                     f"{f['logit error against the scheme in torch (mean)']:.4f} |")
    return [*lines, ""]


def _rendered(table: Path, source: str) -> list[str]:
    """A table a script rendered from the raw JSON `source` beside it (named as missing, never dropped)."""
    return [sourced(table.read_text().strip(), source) if table.is_file() else f"(not measured: {table} is missing)", ""]


def _section(title: str, notes: Path) -> list[str]:
    """A hand-written section kept beside its results, under its title (named as missing, never dropped)."""
    return [f"# {title}", "", notes.read_text().strip() if notes.is_file() else f"(not measured: {notes} is missing)", ""]


if __name__ == "__main__":
    main()
