"""The Seer study on the demo checkpoint: which step-zero signals mark the end of the answer, and what cutting costs.

    python scripts/seer_study.py --phase full       # the expensive part: full-length answers, cached under /tmp
    python scripts/seer_study.py                    # everything else (reuses the cache), writes results JSON + tables
    python scripts/seer_study.py --write-demo-config seer_deploy/models/demos/demo/seer.json

Two prompt sets: calibration prompts (demo tasks drawn with seed HELDOUT_SEED + 1) choose every setting;
the held-out prompts (`heldout_examples`, the seed training never used) only evaluate. For each gen_length:
  * position-matched AUC (answer vs padding at the same position) of every layer's statistics at several thresholds;
  * each detector's boundary quality on the held-out set with settings calibrated on the calibration set, and
    sparsity-detector ablations (the paper's single statistic, detrending, pooling);
  * end to end: exact match, answers identical to full length, tokens processed and wall time of full length,
    each detector and the oracle cut at the true length.
The tables printed here are what docs/seer-study.md reports.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seer_deploy.calibration.collect import StepZeroSet, step_zero_set
from seer_deploy.calibration.detector_fit import (
    CalibrationOptions,
    boundaries,
    candidates,
    choose_floor_margin,
    evaluate,
    fit_detectors,
)
from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin, identity_margins
from seer_deploy.calibration.sparsity_fit import sparsity_config
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.core.sparsity import STAT_NAMES
from seer_deploy.models.checkpoints.checkpoint import checkpoint_fingerprint, load_checkpoint, resolve_checkpoint
from seer_deploy.models.demos.demo_tasks import HELDOUT_SEED, Example, heldout_examples
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.reference import generate
from seer_deploy.seer.config import CHECKPOINT_CONFIG_NAME, SeerConfig, Trend, parse_tail_context
from seer_deploy.seer.metrics import identical_share, mixed_auc, position_matched_auc, true_lengths

CAL_SEED = HELDOUT_SEED + 1

DEMO_SEER_FILE = resolve_checkpoint("demo") / CHECKPOINT_CONFIG_NAME  # the demo's shipped Seer config


def save_atomic(path: Path, write: Any, suffix: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cached_full(model: MaskPredictor, prompts: list[list[int]], config: GenerationConfig, cache: Path, tag: str,
                batch: int) -> tuple[np.ndarray, float]:
    """Full-length answers (and the seconds they took), computed once and kept in `cache`, batch by batch so an
    interrupted run resumes where it stopped."""
    blocks = f"_b{config.block_length}" if config.block_length not in (None, config.gen_length) else ""
    stem = cache / f"full_{tag}_{len(prompts)}_g{config.gen_length}_s{config.steps}{blocks}"
    npy, meta = stem.with_suffix(".npy"), stem.with_suffix(".json")
    if npy.is_file() and meta.is_file():
        return np.load(npy), float(json.loads(meta.read_text())["seconds"])
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    tokens = np.zeros((len(prompts), config.gen_length), dtype=np.int64)
    seconds = 0.0
    for n, lo in enumerate(range(0, len(order), batch)):
        idx = order[lo : lo + batch]
        part, part_meta = Path(f"{stem}.part{n}.npy"), Path(f"{stem}.part{n}.json")
        if part.is_file() and part_meta.is_file():
            tokens[idx] = np.load(part)
            seconds += float(json.loads(part_meta.read_text())["seconds"])
            continue
        start = time.perf_counter()
        rows = generate(model, [prompts[i] for i in idx], config).tokens.numpy()
        took = time.perf_counter() - start
        save_atomic(part, lambda p, r=rows: np.save(p, r), ".npy")
        save_atomic(part_meta, lambda p, t=took: Path(p).write_text(json.dumps({"seconds": t})), ".json")
        tokens[idx], seconds = rows, seconds + took
        print(f"  full {tag} g{config.gen_length} s{config.steps}: {lo + len(idx)}/{len(order)} ({took:.0f}s)", flush=True)
    save_atomic(npy, lambda p: np.save(p, tokens), ".npy")
    save_atomic(meta, lambda p: Path(p).write_text(json.dumps({"seconds": seconds})), ".json")
    return tokens, seconds


def run_batched(model: MaskPredictor, prompts: list[list[int]], config: GenerationConfig, batch: int,
                **kwargs: Any) -> dict[str, Any]:
    """generate() over the prompts in length-sorted batches; tokens in prompt order, reports, work and seconds."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    tokens = np.zeros((len(prompts), config.gen_length), dtype=np.int64)
    reports: list[Any] = [None] * len(prompts)
    processed = 0
    kept_lengths = kwargs.pop("kept_lengths", None)
    start = time.perf_counter()
    for lo in range(0, len(order), batch):
        idx = order[lo : lo + batch]
        extra = dict(kwargs)
        if kept_lengths is not None:
            extra["kept_lengths"] = [int(kept_lengths[i]) for i in idx]
        out = generate(model, [prompts[i] for i in idx], config, **extra)
        tokens[idx] = out.tokens.numpy()
        processed += out.tokens_processed
        for j, i in enumerate(idx):
            reports[i] = out.seer[j] if out.seer else None
    return {"tokens": tokens, "reports": reports, "tokens_processed": processed,
            "seconds": time.perf_counter() - start}


def end_to_end(name: str, run: dict[str, Any], full: np.ndarray, true_len: np.ndarray, examples: list[Example],
               tok: Tokenizer, full_processed: int, oracle_processed: int | None) -> dict[str, Any]:
    """Exact match, identity with full length, kept length and work of one run."""
    G = full.shape[1]
    answers = [tok.decode_answer(row.tolist()) for row in run["tokens"]]
    kept = np.array([r.kept if r is not None else G for r in run["reports"]])
    row: dict[str, Any] = {
        "run": name,
        "exact_match": float(np.mean([a == e.answer for a, e in zip(answers, examples, strict=True)])),
        "identical_to_full": identical_share(run["tokens"], full, true_len),
        "mean_kept": float(kept.mean()),
        "safe": float(np.mean(kept >= true_len)),
        "tokens_processed": int(run["tokens_processed"]),
        "vs_full": run["tokens_processed"] / full_processed,
        "seconds": round(float(run["seconds"]), 2),
    }
    if oracle_processed:
        row["vs_oracle"] = run["tokens_processed"] / oracle_processed
    return row


def auc_rows(data: StepZeroSet, true_len: np.ndarray) -> list[dict[str, Any]]:
    """Position-matched AUC of every (threshold, layer, statistic); also the AUC that ignores position."""
    pad = np.arange(data.gen_length)[None, :] >= true_len[:, None]
    out = []
    for t, values in data.sparsity.items():
        for r, (layer, stat) in enumerate(data.sparsity_rows):
            v = values[:, r]
            if stat == "mean_abs_h" and t != next(iter(data.sparsity)):
                continue  # no threshold: report once
            pooled = mixed_auc(v, pad)
            out.append({"abs": t[0], "rel": t[1], "layer": layer, "stat": stat,
                        "auc_position_matched": round(position_matched_auc(v, true_len), 4),
                        "auc_pooled": round(pooled, 4)})
    return out


def ablations(dcal: StepZeroSet, tcal: np.ndarray, dev: StepZeroSet, tev: np.ndarray, eos_id: int,
              n_layers: int, target: float, thresholds: tuple[float, float], best_row: tuple[int, str]
              ) -> list[dict[str, Any]]:
    """Sparsity-detector variants, each with floor and margin calibrated on the calibration set."""
    G = dcal.gen_length
    last = tuple((n_layers - 1, s) for s in STAT_NAMES)
    every = dcal.sparsity_rows
    variants: dict[str, SeerConfig] = {}
    base = SeerConfig(detector="sparsity")
    raw = base.with_(rows=(best_row,), abs_threshold=thresholds[0], rel_threshold=thresholds[1],
                     stats_layers=(best_row[0],))
    variants["single statistic, raw, plain SNR (the paper)"] = raw.with_(score="snr", trend_term=False)
    variants["single statistic, raw, t-score + drift term"] = raw.with_(score="t", trend_term=True)
    fitted_best = sparsity_config(dcal, tcal, thresholds, (best_row,), base)
    variants["single statistic, detrended, t-score"] = fitted_best.with_(score="t", trend_term=False)
    fitted_last = sparsity_config(dcal, tcal, thresholds, last, base)
    variants["last layer, 4 statistics pooled, detrended, t-score"] = fitted_last.with_(score="t", trend_term=False)
    variants["last layer pooled, not detrended, t-score + drift"] = fitted_last.with_(trends=(), score="t",
                                                                                      trend_term=True)
    fitted_all = sparsity_config(dcal, tcal, thresholds, every, base)
    variants[f"all {n_layers} layers pooled (discriminant), detrended, t-score"] = fitted_all.with_(
        score="t", trend_term=False)
    rows = []
    for name, cfg in variants.items():
        cand, conf = candidates(boundaries(dcal, cfg.with_(floor=0.0), eos_id, "sparsity"))
        floor, margin, _ = choose_floor_margin(cand, conf, tcal, G, target)
        tuned = cfg.with_(floor=floor, margin=margin)
        ev_cand, _ = candidates(boundaries(dev, cfg.with_(floor=-1e9), eos_id, "sparsity"))
        metrics = evaluate(dev, tev, tuned, eos_id, "sparsity")
        rows.append({"variant": name, "argmax_exact": float(np.mean(ev_cand == tev)),
                     "argmax_within_2": float(np.mean(np.abs(ev_cand - tev) <= 2)),
                     "floor": round(floor, 3), "margin": margin, **metrics})
    return rows


def generation(G: int, steps_ratio: float, args: argparse.Namespace) -> GenerationConfig:
    """The decoding every run of the study uses at gen_length G: steps = ratio x G, --block-length blocks."""
    block = args.block_length if args.block_length and args.block_length < G else None
    return GenerationConfig(gen_length=G, steps=max(1, round(G * steps_ratio)), block_length=block)


def study_length(model: MaskPredictor, tok: Tokenizer, G: int, args: argparse.Namespace) -> dict[str, Any]:
    cfg = model.cfg
    config = generation(G, args.steps_ratio, args)
    steps = config.steps
    ev_examples, cal_examples = heldout_examples(args.n), heldout_examples(args.n_cal, seed=CAL_SEED)
    ev_prompts = [tok.encode_prompt(e.prompt) for e in ev_examples]
    cal_prompts = [tok.encode_prompt(e.prompt) for e in cal_examples]
    cal_config = generation(G, args.cal_steps_ratio or args.steps_ratio, args)
    full_cal, _ = cached_full(model, cal_prompts, cal_config, args.cache, "cal", args.batch)
    full_ev, full_seconds = cached_full(model, ev_prompts, config, args.cache, "eval", args.batch)
    if args.phase == "full":
        return {}
    stops = {cfg.eos_id}
    tcal, tev = true_lengths(full_cal, stops), true_lengths(full_ev, stops)
    thresholds = ((0.01, 0.01), (0.02, 0.02), (0.05, 0.05), (0.1, 0.1))
    dcal = step_zero_set(model, cal_prompts, G, thresholds, args.batch)
    dev = step_zero_set(model, ev_prompts, G, thresholds, args.batch)
    print(f"g{G}: step-zero profiles done", flush=True)
    options = CalibrationOptions(target_safe=args.target_safe, thresholds=thresholds)
    cal = fit_detectors(dcal, tcal, cfg.eos_id, cfg.n_layers, options)
    detectors = {name: cal.config.with_(detector=name, margin=entry["margin"])
                 for name, entry in cal.report["detectors"].items()}
    offline = {name: evaluate(dev, tev, c, cfg.eos_id, name) for name, c in detectors.items()}
    aucs = auc_rows(dev, tev)
    best = max((a for a in aucs), key=lambda a: abs(a["auc_position_matched"] - 0.5))
    abl = ablations(dcal, tcal, dev, tev, cfg.eos_id, cfg.n_layers, args.target_safe,
                    (best["abs"], best["rel"]), (best["layer"], best["stat"]))
    print(f"g{G}: offline analysis done", flush=True)
    pad = np.arange(G)[None, :] >= tev[:, None]
    full_processed = sum(steps * (len(p) + G) for p in ev_prompts)
    oracle = run_batched(model, ev_prompts, config, args.batch, kept_lengths=np.maximum(1, tev))
    oracle_processed = oracle["tokens_processed"]
    full_run = {"tokens": full_ev, "reports": [None] * len(ev_prompts), "tokens_processed": full_processed,
                "seconds": full_seconds}
    e2e = [end_to_end("full length", full_run, full_ev, tev, ev_examples, tok, full_processed, oracle_processed),
           end_to_end("oracle (true length)", oracle, full_ev, tev, ev_examples, tok, full_processed, oracle_processed)]
    runs = {f"seer {name} (margin {c.margin})": c for name, c in detectors.items()}
    if args.shipped_config is not None and args.shipped_config.is_file():  # the config `generate --seer` uses
        shipped = SeerConfig.load(args.shipped_config)
        label = f"shipped {args.shipped_config.name}: {shipped.detector}, margin {shipped.margin}"
        runs[f"**{label}, tail context {shipped.tail_context}**"] = shipped
        if shipped.tail_context != 0:  # and as the paper cuts: the later steps on prompt + kept length only
            runs[f"{label}, tail context 0 (the paper's cut)"] = shipped.with_(tail_context=0)
    for label, c in runs.items():
        run = run_batched(model, ev_prompts, config, args.batch, seer=c)
        e2e.append(end_to_end(label, run, full_ev, tev, ev_examples, tok, full_processed, oracle_processed))
        print(f"g{G}: e2e {label} done", flush=True)
    return {
        "gen_length": G, "steps": steps, "block_length": config.block, "cal_steps": cal_config.steps,
        "n_eval": len(ev_prompts),
        "n_cal": len(cal_prompts),
        "mean_true_length": float(tev.mean()), "answers_filling_all_slots": int((tev >= G).sum()),
        "calibration": cal.report | {"config": cal.config.to_dict() | {"trends": "(omitted)"}},
        "offline": offline, "ablations": abl, "auc": aucs, "end_to_end": e2e,
        "eos_prob_inside_answer": float(dev.eos_prob[~pad].mean()) if (~pad).any() else None,
        "eos_prob_in_padding": float(dev.eos_prob[pad].mean()) if pad.any() else None,
    }


def markdown(results: list[dict[str, Any]]) -> str:
    """The tables of docs/seer-study.md."""
    lines: list[str] = []
    for res in results:
        G = res["gen_length"]
        block = res.get("block_length", G)
        blocks = f"blocks of {block}, " if block < G else ""
        lines += [(f"### gen_length {G} (steps {res['steps']}; {blocks}{res['n_eval']} held-out prompts; {res['n_cal']} "
                   f"calibration prompts, their ends from runs of {res['cal_steps']} steps; mean true length "
                   f"{res['mean_true_length']:.2f})"), ""]
        lines += [("Position-matched AUC (padding vs answer at the same position; 0.5 = no signal), best threshold "
                  "per statistic, and the AUC when positions are mixed:"), "",
                  "| layer | " + " | ".join(STAT_NAMES) + " |", "|---|" + "---|" * len(STAT_NAMES)]
        layers = sorted({a["layer"] for a in res["auc"]})
        for layer in layers:
            cells = []
            for stat in STAT_NAMES:
                cands = [a for a in res["auc"] if a["layer"] == layer and a["stat"] == stat]
                b = max(cands, key=lambda a: abs(a["auc_position_matched"] - 0.5))
                where = "" if stat == "mean_abs_h" else f" @{b['abs'] if 'abs' in stat else b['rel']}"
                cells.append(f"{b['auc_position_matched']:.3f}{where} (mixed {b['auc_pooled']:.3f})")
            lines.append(f"| {layer} | " + " | ".join(cells) + " |")
        lines += ["", "Detectors on the held-out prompts (settings from the calibration prompts):", "",
                  "| detector | safe | exact | truncated | mean overshoot | mean kept | kept fraction |",
                  "|---|---|---|---|---|---|---|"]
        for name, m in res["offline"].items():
            lines.append(f"| {name} | {m['safe']:.3f} | {m['exact']:.3f} | {m['truncated']:.3f} | "
                         f"{m['mean_overshoot']:.2f} | {m['mean_kept']:.2f} | {m['kept_fraction']:.3f} |")
        lines += ["", "Sparsity-detector variants (floor and margin calibrated per variant):", "",
                  "| variant | argmax exact | argmax within 2 | floor | margin | safe | truncated | mean kept |",
                  "|---|---|---|---|---|---|---|---|"]
        for a in res["ablations"]:
            floor = "never cuts" if a["floor"] >= 1e8 else f"{a['floor']:.2f}"
            lines.append(f"| {a['variant']} | {a['argmax_exact']:.3f} | {a['argmax_within_2']:.3f} | {floor} | "
                         f"{a['margin']} | {a['safe']:.3f} | {a['truncated']:.3f} | {a['mean_kept']:.2f} |")
        lines += ["", "End to end (torch reference loop, batches of 64 sorted by prompt length):", "",
                  ("| run | exact match | identical to full | safe | mean kept | tokens processed | vs full | "
                  "vs oracle | seconds |"), "|---|---|---|---|---|---|---|---|---|"]
        for e in res["end_to_end"]:
            lines.append(f"| {e['run']} | {e['exact_match']:.3f} | {e['identical_to_full']:.3f} | "
                         f"{e['safe']:.3f} | {e['mean_kept']:.2f} | {e['tokens_processed']:,} | {e['vs_full']:.3f} | "
                         f"{e.get('vs_oracle', 0):.2f} | {e['seconds']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def fit_margin_end_to_end(model: MaskPredictor, prompts: list[list[int]], config: SeerConfig,
                          args: argparse.Namespace) -> dict[str, Any]:
    """`identity_fit.fit_identity_margin` on the calibration prompts at gen_length --identity-gen-length with one token
    a step, for margins from the safe-rate calibration's up to 16 more in steps of 2, then (if no margin reaches
    the target) the --identity-tail-contexts at the knee margin."""
    G = args.identity_gen_length
    gen = generation(G, 1.0, args)
    full, _ = cached_full(model, prompts, gen, args.cache, "cal", args.batch)
    true_len = true_lengths(full, {model.cfg.eos_id})

    def run_seer(seer: SeerConfig) -> tuple[np.ndarray, np.ndarray]:
        run = run_batched(model, prompts, gen, args.batch, seer=seer)
        return run["tokens"], np.array([r.kept for r in run["reports"]])

    goal = IdentityGoal(args.target_identical, tuple(args.identity_tail_contexts), slack=args.identity_slack)
    fit = fit_identity_margin(run_seer, config, full, true_len, identity_margins(config, G), goal,
                              log=lambda line: print(line, flush=True))
    return {**fit.to_dict(), "gen_length": G, "mean_true_length": round(float(true_len.mean()), 2)}


def write_demo_config(model: MaskPredictor, tok: Tokenizer, args: argparse.Namespace, lengths: Sequence[int]) -> None:
    """Calibrate on the calibration prompts at the first length, add the other lengths' trends, write the file."""
    cfg = model.cfg
    primary, *others = lengths
    thresholds = ((0.01, 0.01), (0.02, 0.02), (0.05, 0.05), (0.1, 0.1))
    cal_prompts = [tok.encode_prompt(e.prompt) for e in heldout_examples(args.n_cal, seed=CAL_SEED)]

    def data_for(G: int) -> tuple[StepZeroSet, np.ndarray]:
        config = generation(G, args.cal_steps_ratio or args.steps_ratio, args)
        full, _ = cached_full(model, cal_prompts, config, args.cache, "cal", args.batch)
        return step_zero_set(model, cal_prompts, G, thresholds, args.batch), true_lengths(full, {cfg.eos_id})

    data, true_len = data_for(primary)
    options = CalibrationOptions(target_safe=args.target_safe, thresholds=thresholds, detector=args.detector)
    result = fit_detectors(data, true_len, cfg.eos_id, cfg.n_layers, options)
    config = result.config
    trends = list(config.trends)
    for G in others:  # the same rows and weights; the positional trend is re-fitted at each length
        d, t = data_for(G)
        refit = sparsity_config(d, t, (config.abs_threshold, config.rel_threshold), config.rows, config)
        trends.append(Trend(G, refit.trends[0].mean, refit.trends[0].scale))
    config = config.with_(trends=tuple(trends))
    margin_fit = fit_margin_end_to_end(model, cal_prompts, config, args)
    config = config.with_(margin=margin_fit["margin"], tail_context=margin_fit["tail_context"],
                          calibration=result.report | {
        "prompts": f"{args.n_cal} demo-task prompts, seed HELDOUT_SEED + 1 (not the held-out evaluation prompts)",
        "trend_lengths": [t.gen_length for t in trends], "identity_margin": margin_fit})
    config.save(args.write_demo_config)
    print(f"wrote {args.write_demo_config}: {config.detector}, margin {config.margin}, "
          f"tail context {config.tail_context}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500, help="held-out evaluation prompts")
    ap.add_argument("--n-cal", type=int, default=500, help="calibration prompts")
    ap.add_argument("--gen-lengths", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps-ratio", type=float, default=1.0, help="steps = ratio * gen_length (1.0: one token a step)")
    ap.add_argument("--cal-steps-ratio", type=float, default=None,
                    help="steps ratio of the calibration prompts' full runs (only their answer ends are used); "
                         "default: --steps-ratio")
    ap.add_argument("--block-length", type=int, default=None,
                    help="semi-autoregressive blocks of this many slots (default: one block of gen_length)")
    ap.add_argument("--target-safe", type=float, default=0.995)
    ap.add_argument("--target-identical", type=float, default=0.995,
                    help="share of calibration answers that must equal full length's (the margin fit)")
    ap.add_argument("--identity-slack", type=float, default=0.01,
                    help="if the target is not reached: accept the smallest margin within this of the best rate")
    ap.add_argument("--identity-gen-length", type=int, default=64, help="gen_length of the margin fit")
    ap.add_argument("--identity-tail-contexts", type=parse_tail_context, nargs="*", default=[],
                    help="tail contexts (N or 'all', cheapest first) tried at the knee margin when no margin reaches "
                         "--target-identical (see SeerConfig.tail_context)")
    ap.add_argument("--shipped-config", type=Path, default=DEMO_SEER_FILE,
                    help="also run this Seer config end to end (default: the demo's shipped calibration)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/seer_study"))
    ap.add_argument("--phase", choices=["full", "all"], default="all")
    ap.add_argument("--write-demo-config", type=Path, default=None)
    ap.add_argument("--detector", default="fused", help="the detector the demo config uses")
    ap.add_argument("--checkpoint", default="demo", help="checkpoint directory (default: the bundled demo)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(args.checkpoint)
    args.cache = args.cache / checkpoint_fingerprint(args.checkpoint)[:12]  # a retrained model never reuses old runs
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id)
    if args.write_demo_config is not None:
        write_demo_config(ckpt.model, tok, args, sorted(args.gen_lengths, reverse=True))
        return
    results = []
    suffix = f"_b{args.block_length}" if args.block_length else ""  # one-block results keep their names
    for G in args.gen_lengths:
        res = study_length(ckpt.model, tok, G, args)
        if res:
            results.append(res)
            out = args.cache / f"results_g{G}{suffix}.json"
            save_atomic(out, lambda p, r=res: Path(p).write_text(json.dumps(r, indent=1, default=_jsonable)), ".json")
    if results:
        md = markdown(results)
        save_atomic(args.cache / f"results{suffix}.md", lambda p: Path(p).write_text(md), ".md")
        print(md)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


if __name__ == "__main__":
    main()
