"""Seer on quantized weights (issue 31): does the step-zero boundary survive int8 and int4?

For the demo (and demo-vl, on pictures) this exports the checkpoint at fp32 and weight-only int8 / int4 at two block
sizes (and int4 with the LM head kept at fp32), each graph computing the statistics the shipped Seer config reads (as
`seer-deploy bench` exports), and on each export, on ONNX Runtime:
  * runs the held-out prompts with the shipped config: the boundary Seer detects and the kept length against fp32's
    (share agreeing within 0 / 1 / 2 slots), answers identical to fp32's full-length answer, exact match;
  * calibrates on the export itself (`calibrate_model` on its `BackendSource`, prompts of a calibration seed, split
    half / half as `seer-deploy calibrate` splits them): the margins it picks, and the held-out run with that config
    (tail context kept at the shipped one's, so only the detector settings change);
  * on the calibration prompts, whether its full-length answers equal fp32's (quantization alone, no cut).
fp32's full-length run of the held-out prompts is the reference. Raw JSON and a markdown table go to --out.

    PYTHONPATH=. python benchmarks/quant_study.py --out benchmarks/results-quant
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seer_deploy.calibration.collect import stop_ids
from seer_deploy.calibration.detector_fit import CalibrationOptions, calibrate_model
from seer_deploy.calibration.prompt_set import prepare_prompts
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.atomic import write_atomic
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.demos import demo_tasks, demo_vl_tasks
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.runtime.targets import checkpoint_seer
from seer_deploy.seer.metrics import identical_share, true_lengths
from seer_deploy.service import Run, Service, ServiceOptions, TargetOptions

VARIANTS: dict[str, Quantization | None] = {
    "fp32": None,
    "int8 b32": Quantization("int8", 32),
    "int8 b128": Quantization("int8", 128),
    "int4 b32": Quantization("int4", 32),
    "int4 b128": Quantization("int4", 128),
    "int4 b32 keep-head": Quantization("int4", 32, keep_head=True),
}


@dataclass(frozen=True)
class Workload:
    """A checkpoint, its held-out examples and calibration examples (another seed), as requests."""

    checkpoint: str
    export: Callable[..., Any]
    evaluate: list[Any]
    calibrate: list[Any]
    request: Callable[[Any], Prompt]
    gen_length: int


def workloads(args: argparse.Namespace) -> list[Workload]:
    text = Workload("demo", export_checkpoint, demo_tasks.heldout_examples(args.n),
                    demo_tasks.heldout_examples(args.n_cal, seed=demo_tasks.HELDOUT_SEED + 1),
                    lambda e: Prompt(e.prompt), args.gen_length)
    vl = Workload("demo-vl", export_multimodal, demo_vl_tasks.heldout_examples(args.vl_n),
                  demo_vl_tasks.heldout_examples(args.vl_n_cal, seed=demo_vl_tasks.HELDOUT_SEED + 1),
                  lambda e: Prompt(e.prompt, (e.image(),)), args.vl_gen_length)
    return [w for w in (text, vl) if w.checkpoint in args.workloads]


def run_rows(run: Run) -> dict[str, Any]:
    """What a run's answers say per prompt: the boundary Seer detected, the kept length, the ids and the text."""
    return {"boundary": [a.seer.boundary if a.seer else None for a in run.answers],
            "kept": [a.seer.kept if a.seer else len(a.tokens) for a in run.answers],
            "tokens": [a.tokens for a in run.answers], "text": [a.text for a in run.answers],
            "seconds": round(run.seconds, 2)}


def measure(w: Workload, export: Path, args: argparse.Namespace, full_length: bool, recalibrate: bool
            ) -> dict[str, Any]:
    """The calibration on one export and its held-out runs: with the shipped config, with its own calibrated config
    (`recalibrate`), at full length (`full_length`)."""
    config = GenerationConfig(gen_length=w.gen_length, steps=w.gen_length)
    service = Service(export, ServiceOptions(generation=config, batch_size=args.batch,
                                             target=TargetOptions(threads=args.threads)))
    assert service.seer is not None  # the checkpoint's shipped config
    requests = [w.request(e) for e in w.evaluate]
    cal = prepare_prompts(str(export), [w.request(e) for e in w.calibrate], config, args.batch, args.threads)
    started = time.perf_counter()
    cal_full, _ = cal.source.answers(cal.ids, config, batch_size=args.batch)
    fitted = calibrate_model(cal.source, cal.ids, config, CalibrationOptions(), full_tokens=cal_full,
                             batch_size=args.batch)
    calibration_seconds = time.perf_counter() - started
    recalibrated = fitted.config.with_(tail_context=service.seer.tail_context)
    out: dict[str, Any] = {
        "calibration": {name: {"margin": d["margin"], "validation": d["validation"]}
                        for name, d in fitted.report["detectors"].items()}
        | {"sparsity_choice": fitted.report["sparsity_choice"], "statistics": fitted.report["statistics"],
           "seconds": round(calibration_seconds, 2)},
        "calibration_full": cal_full.tolist(),
        "shipped": run_rows(service.generate(requests)),
    }
    if recalibrate:
        out["recalibrated"] = run_rows(service.generate(requests, seer=recalibrated))
    if full_length:
        out["full"] = run_rows(service.generate(requests, full_length=True))
    return out


def within(a: Sequence[int | None], b: Sequence[int | None], slots: int) -> float:
    """Share of prompts whose values agree within `slots` (no boundary agrees only with no boundary)."""
    return float(np.mean([x == y if x is None or y is None else abs(x - y) <= slots for x, y in zip(a, b, strict=True)]))


def compare(w: Workload, results: dict[str, dict[str, Any]], eos: set[int]) -> list[dict[str, Any]]:
    """Each variant against fp32: agreement of boundaries and kept lengths, identity with fp32's full length."""
    ref = results["fp32"]
    full = np.array(ref["full"]["tokens"])
    true_len = true_lengths(full, eos)
    cal_full = np.array(ref["calibration_full"])
    cal_true = true_lengths(cal_full, eos)
    answers = [e.answer for e in w.evaluate]
    rows = []
    for name, r in results.items():
        row: dict[str, Any] = {"weights": name}
        for slots in (0, 1, 2):
            row[f"boundary_within_{slots}"] = within(r["shipped"]["boundary"], ref["shipped"]["boundary"], slots)
            row[f"kept_within_{slots}"] = within(r["shipped"]["kept"], ref["shipped"]["kept"], slots)
        for run in (k for k in ("shipped", "recalibrated") if k in r):
            row[run] = {"mean_kept": float(np.mean(r[run]["kept"])),
                        "identical_to_fp32_full": identical_share(np.array(r[run]["tokens"]), full, true_len),
                        "exact_match": float(np.mean([t == a for t, a in zip(r[run]["text"], answers, strict=True)]))}
        row["margins"] = {d: r["calibration"][d]["margin"] for d in ("fused", "sparsity", "eos")}
        row["sparsity_choice"] = r["calibration"]["sparsity_choice"]
        row["full_identical_on_calibration_prompts"] = identical_share(np.array(r["calibration_full"]), cal_full, cal_true)
        if "full" in r:
            row["full_exact_match"] = float(np.mean([t == a for t, a in zip(r["full"]["text"], answers, strict=True)]))
        rows.append(row)
    return rows


def table(w: Workload, rows: list[dict[str, Any]]) -> str:
    lines = [(f"**{w.checkpoint}**: {len(w.evaluate)} held-out prompts, gen_length {w.gen_length}, greedy, one token "
              f"a step; calibrated on {len(w.calibrate)} prompts of another seed (half fit, half validate)."), "",
             ("| weights | boundary = fp32 (0 / 1 / 2 slots) | kept = fp32 (0 / 1 / 2) | mean kept | identical to fp32 "
              "full | exact | margin fused / sparsity / eos (own calibration) | recalibrated: mean kept / identical / "
              "exact | full length = fp32 full (cal. prompts) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, c = r["shipped"], r.get("recalibrated")
        b = " / ".join(f"{r[f'boundary_within_{k}']:.3f}" for k in (0, 1, 2))
        k = " / ".join(f"{r[f'kept_within_{n}']:.3f}" for n in (0, 1, 2))
        m = " / ".join(str(r["margins"][d]) for d in ("fused", "sparsity", "eos"))
        recalibrated = "(not run)" if c is None else " / ".join(
            (f"{c['mean_kept']:.2f}", f"{c['identical_to_fp32_full']:.3f}", f"{c['exact_match']:.3f}"))
        lines.append(f"| {r['weights']} | {b} | {k} | {s['mean_kept']:.2f} | {s['identical_to_fp32_full']:.3f} | "
                     f"{s['exact_match']:.3f} | {m} | {recalibrated} | {r['full_identical_on_calibration_prompts']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500, help="demo held-out prompts")
    ap.add_argument("--n-cal", type=int, default=100, help="demo calibration prompts (another seed)")
    ap.add_argument("--vl-n", type=int, default=100, help="demo-vl held-out pictures")
    ap.add_argument("--vl-n-cal", type=int, default=60, help="demo-vl calibration pictures")
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--vl-gen-length", type=int, default=64)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--recalibrate", nargs="*", default=["fp32", "int4 b32", "int4 b128", "int4 b32 keep-head"],
                    choices=list(VARIANTS), help="variants whose held-out prompts also run with their own calibration")
    ap.add_argument("--vl-variants", nargs="+", default=["fp32", "int8 b32", "int4 b32", "int4 b128"],
                    choices=list(VARIANTS), help="the variants run on demo-vl")
    ap.add_argument("--workloads", nargs="+", default=["demo", "demo-vl"], choices=["demo", "demo-vl"])
    ap.add_argument("--full-length-all", action="store_true", help="also each variant's own full-length run")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/quant_study"), help="where the exports go")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results-quant"))
    args = ap.parse_args()
    if "fp32" not in args.variants or "fp32" not in args.vl_variants:
        ap.error("--variants needs fp32: every variant is compared with it")
    args.out.mkdir(parents=True, exist_ok=True)
    tables, started = [], time.perf_counter()
    for w in workloads(args):
        shipped = checkpoint_seer(w.checkpoint)
        results, seconds = {}, {}
        for name in args.variants if w.checkpoint == "demo" else args.vl_variants:
            t0 = time.perf_counter()
            where = args.work / w.checkpoint / name.replace(" ", "-")
            options = ExportOptions(seer=shipped, quantization=VARIANTS[name], verify=False)
            export = w.export(w.checkpoint, where, options).out
            results[name] = measure(w, export, args, full_length=name == "fp32" or args.full_length_all,
                                    recalibrate=name in args.recalibrate)
            seconds[name] = round(time.perf_counter() - t0, 1)
            print(f"{w.checkpoint} {name}: {seconds[name]} s", flush=True)
        cfg = ExportManifest.load(args.work / w.checkpoint / "fp32").model_config()
        rows = compare(w, results, stop_ids(cfg))
        runs = {name: {key: ({k: v for k, v in run.items() if k != "tokens"} if isinstance(run, dict) else run)
                       for key, run in r.items() if key != "calibration_full"} for name, r in results.items()}
        raw = {"workload": w.checkpoint, "gen_length": w.gen_length, "n": len(w.evaluate), "n_cal": len(w.calibrate),
               "threads": args.threads, "seconds": seconds, "rows": rows, "runs": runs}
        path = args.out / f"{w.checkpoint}.json"
        write_atomic(path, lambda p, raw=raw: p.write_text(json.dumps(raw)))
        tables.append(table(w, rows))
    total = time.perf_counter() - started
    text = "\n\n".join(tables) + (f"\n\n({total / 60:.1f} minutes on {args.threads} threads, "
                                   f"{time.process_time() / 60:.1f} minutes of CPU.)\n")
    write_atomic(args.out / "quant_study.md", lambda p: p.write_text(text))
    print(text)


if __name__ == "__main__":
    main()
