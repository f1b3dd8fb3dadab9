"""The bench report in markdown, rendered from the bench JSON alone (so a committed JSON can be re-rendered).

`headline` is the one sentence the README quotes; `targets` checks the issue's targets (reported, never asserted);
`render_markdown` is the whole document: headline, command, machine, one table per batch size, footnotes, targets,
what each row is, and the cost-scaling table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TARGET_GEN, TARGET_BATCH = 256, 1
TARGET_SPEEDUP, TARGET_ORACLE_SHARE = 10.0, 0.7

FOOTNOTES = (
    ("**tok/s**: answer tokens per second: the tokens before the first EOS in each of the row's own answers, summed "
    "over the prompts, divided by the median wall seconds to answer all prompts (batch calls only; warm-up excluded)."),
    ("**p50 / p95**: percentiles over requests of each request's latency, the wall time of the batch call that "
    "answered it (median over the timed passes)."),
    ("**passes**: forward passes over all batches; **tokens**: real (non-padding) tokens through the model, summed "
    "over the passes."),
    "**speedup**: the reference row's median seconds divided by the row's, same gen_length and batch.",
    ("**tok / ans**: tokens processed per answer token (the work behind each token of an answer; a cached pass "
    "counts its window's tokens); **step 0**: share of the row's time spent in step zero, the one full-length pass "
    "Seer cannot cut."),
    ("**first step ms**: time to first step: the row's engine's load time (each engine is opened once per bench) "
    "plus the row's first call (its warm-up batch) up to the end of step zero; what a first request waits on a "
    "freshly opened service (`generate --json` reports it as first_step_s)."),
    ("**Seer / oracle**: the Seer row's speedup divided by the oracle's on the same engine (= oracle seconds / Seer "
    "seconds); 1.0 would be a perfect detector with a free step zero."),
    ("**exact**: share of answers equal to the task's answer (`seer_deploy.models.demos.demo_tasks`); **= full**: share of "
    "answers identical to the reference's full-length answer; **kept**: mean response slots the steps after step zero "
    "decoded (Seer; with a tail context the steps also ran cut slots after them, as committed EOS) or all steps ran on "
    "(oracle); **safe**: share kept at or past the full-length answer's end."),
)


@dataclass(frozen=True)
class TargetCheck:
    name: str
    wanted: str
    measured: str
    met: bool
    gap: str  # by how much it was missed ('' when met)


def _find(data: dict[str, Any], gen: int, batch: int, row: str) -> dict[str, Any] | None:
    return next((r for r in data["rows"] if (r["gen_length"], r["batch_size"], r["row"]) == (gen, batch, row)), None)


def _headline_setting(data: dict[str, Any]) -> tuple[int, int]:
    """gen_length 256 at batch 1 when measured, else the longest gen_length at the smallest batch."""
    if _find(data, TARGET_GEN, TARGET_BATCH, "ort-seer") is not None:
        return TARGET_GEN, TARGET_BATCH
    return max(r["gen_length"] for r in data["rows"]), min(r["batch_size"] for r in data["rows"])


def headline(data: dict[str, Any]) -> str:
    G, B = _headline_setting(data)
    seer, oracle = _find(data, G, B, "ort-seer"), _find(data, G, B, "ort-oracle")
    ref, full = _find(data, G, B, "reference"), _find(data, G, B, "ort-full")
    if seer is None or oracle is None or ref is None or full is None:
        return "The bench did not measure ort-seer against the reference."
    return (
        f"At gen_length {G}, batch {B}, Seer on ONNX Runtime answers {seer['speedup']:.1f}x faster than the torch "
        f"reference loop ({seer['tokens_per_s']:.0f} vs {ref['tokens_per_s']:.0f} answer tokens/s; ONNX Runtime at "
        f"full length: {full['speedup']:.1f}x), {seer['seer_over_oracle']:.2f} of the oracle's {oracle['speedup']:.1f}x, "
        f"with exact match {seer['exact_match']:.2f} against {ref['exact_match']:.2f} at full length."
    )


def targets(data: dict[str, Any]) -> list[TargetCheck]:
    """The issue's targets at gen_length 256, batch 1 (empty when that setting was not measured)."""
    seer = _find(data, TARGET_GEN, TARGET_BATCH, "ort-seer")
    ref = _find(data, TARGET_GEN, TARGET_BATCH, "reference")
    if seer is None or ref is None:
        return []
    speed, share = seer["speedup"], seer["seer_over_oracle"]
    acc, ref_acc = seer["exact_match"], ref["exact_match"]
    return [
        TargetCheck("ort-seer speedup against the reference", f">= {TARGET_SPEEDUP:.0f}x", f"{speed:.2f}x",
                    speed >= TARGET_SPEEDUP, "" if speed >= TARGET_SPEEDUP else
                    f"{TARGET_SPEEDUP - speed:.2f}x short ({speed / TARGET_SPEEDUP:.0%} of the target)"),
        TargetCheck("ort-seer share of the oracle's speedup", f">= {TARGET_ORACLE_SHARE}", f"{share:.2f}",
                    share >= TARGET_ORACLE_SHARE, "" if share >= TARGET_ORACLE_SHARE else
                    f"{TARGET_ORACLE_SHARE - share:.2f} short"),
        TargetCheck("ort-seer exact match against full length (reference)", f">= {ref_acc:.3f}", f"{acc:.3f}",
                    acc >= ref_acc, "" if acc >= ref_acc else f"{ref_acc - acc:.3f} lower"),
    ]


FAST_TARGET_GENS, FAST_TARGET_BATCHES = (256, 512), (1, 8)
FAST_OVER_FASTDLLM, FAST_OVER_FULL, FAST_EXACT_POINTS = 2.0, 10.0, 0.01


def fast_targets(data: dict[str, Any]) -> list[TargetCheck]:
    """The speed issue's targets for ort-seer-fast at each measured (gen_length 256 / 512, batch 1 / 8): at least 2x
    ort-fastdllm's speed and 10x ort-full's, exact match within 1 point of full length's (ort-full)."""
    checks = []
    for G in FAST_TARGET_GENS:
        for B in FAST_TARGET_BATCHES:
            fast, peer, full = (_find(data, G, B, row) for row in ("ort-seer-fast", "ort-fastdllm", "ort-full"))
            if fast is None or peer is None or full is None:
                continue
            over_peer, over_full = peer["seconds"] / fast["seconds"], full["seconds"] / fast["seconds"]
            drop = full["exact_match"] - fast["exact_match"]
            where = f"gen {G}, batch {B}: ort-seer-fast"
            checks += [
                TargetCheck(f"{where} against ort-fastdllm", f">= {FAST_OVER_FASTDLLM:.0f}x", f"{over_peer:.2f}x",
                            over_peer >= FAST_OVER_FASTDLLM, "" if over_peer >= FAST_OVER_FASTDLLM else
                            f"{over_peer / FAST_OVER_FASTDLLM:.0%} of the target"),
                TargetCheck(f"{where} against ort-full", f">= {FAST_OVER_FULL:.0f}x", f"{over_full:.2f}x",
                            over_full >= FAST_OVER_FULL, "" if over_full >= FAST_OVER_FULL else
                            f"{over_full / FAST_OVER_FULL:.0%} of the target"),
                TargetCheck(f"{where} exact match against ort-full's", f">= {full['exact_match'] - FAST_EXACT_POINTS:.2f}",
                            f"{fast['exact_match']:.2f} (identical to full: {fast['identical_to_full']:.2f})",
                            drop <= FAST_EXACT_POINTS + 1e-9, "" if drop <= FAST_EXACT_POINTS + 1e-9 else
                            f"{drop:.2f} lower"),
            ]
    return checks


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}" if seconds < 10 else f"{seconds:.1f} s"


def _first_step(seconds: float | None) -> str:
    return "-" if seconds is None else _ms(seconds)


def results_table(data: dict[str, Any], batch: int) -> list[str]:
    lines = [
        ("| gen | row | tok/s | p50 ms | p95 ms | passes | tokens | tok / ans | step 0 | first step ms | speedup "
        "| Seer / oracle | exact | = full | kept | safe |"),
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        if r["batch_size"] != batch:
            continue
        lines.append(
            f"| {r['gen_length']} | {r['row']} | {r['tokens_per_s']:.1f} | {_ms(r['latency_p50_s'])} | "
            f"{_ms(r['latency_p95_s'])} | {r['forward_passes']:,} | {r['tokens_processed']:,} | "
            f"{_num(r.get('tokens_per_answer_token'), '.1f')} | {_share(r.get('step_zero_share'))} | "
            f"{_first_step(r.get('first_step_s'))} | "
            f"{r['speedup']:.2f}x | {_num(r['seer_over_oracle'], '.2f')} | {r['exact_match']:.2f} | "
            f"{r['identical_to_full']:.2f} | {_num(r['mean_kept'], '.1f')} | {_num(r['safe'], '.2f')} |"
        )
    return lines


def scaling_table(scaling: dict[str, Any]) -> list[str]:
    points = scaling["points"]
    backends = list(dict.fromkeys(p["backend"] for p in points))
    lengths = sorted({p["seq_len"] for p in points})
    ms = {(p["backend"], p["seq_len"]): p["ms"] for p in points}
    longest = lengths[-1]
    head = " | ".join(f"{b} ms | {b} / {b}@{longest}" for b in backends)
    lines = [f"| length | {head} |", "|---:|" + "---:|" * (2 * len(backends))]
    for n in lengths:
        cells = " | ".join(f"{ms[(b, n)]:.1f} | {ms[(b, n)] / ms[(b, longest)]:.3f}" for b in backends)
        lines.append(f"| {n} | {cells} |")
    return lines


DEFAULT_WORKLOAD = "held-out demo prompts (tasks in rotation)"  # what results without a 'workload' setting ran


def _vision(model: dict[str, Any]) -> str:
    """' + a 0.18M-parameter vision tower (16 image tokens per picture)' for multimodal models, else ''."""
    if "vision_parameters" not in model:
        return ""
    return (f" + a {model['vision_parameters'] / 1e6:.2f}M-parameter vision tower ({model['tokens_per_image']} image "
            f"tokens per {model['image_size']} px picture)")


def _tail_contexts(seer: dict[str, Any], settings: dict[str, Any]) -> str:
    """', tail context X' for the config (0, the paper's cut, unless set), and the ort-seer-tail row's override."""
    text = f", tail context {seer.get('tail_context', 0)}"
    if settings.get("tail_context") is not None:
        text += f" (ort-seer-tail: {settings['tail_context']})"
    return text


def _fast_rows(settings: dict[str, Any]) -> str:
    fast = settings.get("fast_rows")
    if not fast:
        return ""
    canvas = f"; ort-seer-progressive's first canvas: {fast['first_canvas']} slots" if "first_canvas" in fast else ""
    return (f" The fast rows ({', '.join(fast['rows'])}) decode by the threshold rule at {fast['threshold']:g} over "
            f"blocks of {fast['block_length']} (one block where that does not divide gen_length), with the dual KV "
            f"cache except ort-parallel{canvas}.")


def render_markdown(data: dict[str, Any], plot_file: str | None = "bench.png") -> str:
    m, s = data["machine"], data["settings"]
    seer = data["seer"]
    out = [f"# seer-deploy bench: {data['model']['target']}", "", headline(data), ""]
    out += [
        f"Command: `{data['command']}` (started {data['started']}, {data['seconds']:.0f} s of measurements).",
        "",
        f"Machine: {m['cpu']}, {m['usable_cores']} usable of {m['logical_cores']} logical cores, torch threads "
        f"{m['torch_threads']}, load average at start {m['load_average'][0]:.2f}; GPU: {m['gpu'] or 'none'}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + f"; loop core: {m['loop_core']}.",
        "",
        (f"Model: {data['model']['parameters'] / 1e6:.2f}M parameters ({data['model']['n_layers']} layers, d_model "
        f"{data['model']['d_model']}){_vision(data['model'])}, exported to ONNX once in {data['model']['export_seconds']:.1f} s; ONNX Runtime "
        f"providers {', '.join(data['model']['ort_providers'])}. Seer: {seer['source']} config, {seer['detector']} "
        f"detector, margin {seer['margin']}{_tail_contexts(seer, s)}."),
        "",
        (f"Workload: {s['prompts']} {s.get('workload', DEFAULT_WORKLOAD)} per setting, greedy, steps = gen_length, "
        f"one block; one warm-up batch per row and setting, then the median of {s['repeats']} timed passes."
        + _fast_rows(s)),
        "",
    ]
    for batch in sorted({r["batch_size"] for r in data["rows"]}):
        out += [f"## Batch {batch}", ""] + results_table(data, batch) + [""]
    out += [f"{i}. {note}" for i, note in enumerate(FOOTNOTES, start=1)] + [""]
    checks = targets(data)
    fast = fast_targets(data)
    if fast:
        out += ["## Targets of the fast rows (reported, not asserted)", "",
                "| target | wanted | measured | met |", "|---|---|---|---|"]
        out += [f"| {c.name} | {c.wanted} | {c.measured} | {'yes' if c.met else 'no: ' + c.gap} |" for c in fast]
        out.append("")
    if checks:
        out += [f"## Targets (gen_length {TARGET_GEN}, batch {TARGET_BATCH}; reported, not asserted)", "",
                "| target | wanted | measured | met |", "|---|---|---|---|"]
        out += [f"| {c.name} | {c.wanted} | {c.measured} | {'yes' if c.met else 'no: ' + c.gap} |" for c in checks]
        out.append("")
    out += ["## Rows", ""] + [f"- **{name}**: {text}" for name, text in data["row_descriptions"].items()] + [""]
    if data["skipped"]:
        out += [f"- **{k['row']}** skipped: {k['why']}" for k in data["skipped"]] + [""]
    if data["notes"]:
        out += [f"Note: {note}" for note in data["notes"]] + [""]
    scaling = data.get("scaling")
    if scaling:
        st = scaling["settings"]
        out += [
            "## Cost scaling: step time against sequence length", "",
            (f"A LLaDA-shaped model with random weights ({scaling['parameters'] / 1e6:.0f}M parameters: d_model "
            f"{st['d_model']}, {st['n_layers']} layers, {st['n_heads']} heads, MLP {st['mlp_hidden']}, vocab "
            f"{st['vocab_size']}; {scaling['weights_mb']:.0f} MB fp32, exported in {scaling['export_seconds']:.0f} s), "
            f"one denoising step at batch {st['batch']}, median of {st['repeats']} calls after a warm-up. The ratio "
            f"columns are the cost of a step at that length relative to the longest: what truncating a response to "
            f"that length saves per step, independent of any model's accuracy."), "",
        ]
        out += scaling_table(scaling) + [""]
    if plot_file:
        out += [f"![speedup against gen_length; step time against length]({plot_file})", ""]
    return "\n".join(out)
