"""Seer against full length and the oracle cut: seconds and tokens processed on held-out demo prompts.

For each gen_length (steps = gen_length, one block, greedy): the full-length loop, the Seer loop with the demo's
calibrated config (or --seer-config), and the oracle that keeps exactly each answer's true length (taken from the
full-length run). Reports wall seconds (best of --repeats), forward passes, tokens processed and exact match.
Nothing is asserted; the numbers go in docs/seer-study.md.

    python benchmarks/bench_seer.py [--n 64] [--batch 16] [--gen-lengths 64 128 256] [--loop reference|runtime]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.targets import find_seer_config
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.metrics import true_lengths


def run(model: MaskPredictor, loop: str, prompts: list[list[int]], config: GenerationConfig, batch: int,
        seer: SeerConfig | None, kept: np.ndarray | None) -> dict[str, Any]:
    """One pass over the prompts in batches of `batch` (in the given order); tokens, passes, work and seconds."""
    cfg = model.cfg
    backend = TorchBackend(model, seer.stats_spec(cfg.n_layers) if seer is not None else None)
    tokens, kept_out, steps, processed = [], [], 0, 0
    start = time.perf_counter()
    for lo in range(0, len(prompts), batch):
        chunk = prompts[lo : lo + batch]
        forced = None if kept is None else [int(k) for k in kept[lo : lo + batch]]
        if loop == "reference":
            out = generate(model, chunk, config, seer=seer, kept_lengths=forced)
            tokens.append(out.tokens.numpy())
        else:
            out = run_generation(backend, chunk, config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.eos_id, eos=cfg.eos_id), seer=seer,  # type: ignore[assignment]
                                 kept_lengths=forced)
            tokens.append(out.tokens)  # type: ignore[arg-type]
        steps += out.passes
        processed += out.tokens_processed
        kept_out += [r.kept for r in out.seer] if out.seer else [config.gen_length] * len(chunk)
    return {"seconds": time.perf_counter() - start, "tokens": np.concatenate(tokens), "passes": steps,
            "tokens_processed": processed, "kept": np.array(kept_out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=64, help="held-out prompts")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gen-lengths", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--repeats", type=int, default=1, help="timed passes per run (best is reported)")
    ap.add_argument("--loop", choices=["reference", "runtime"], default="reference")
    ap.add_argument("--seer-config", type=Path, default=None, help="default: the demo's calibrated config")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint("demo")
    model = ckpt.model
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id)
    seer = SeerConfig.load(args.seer_config) if args.seer_config else find_seer_config("demo")
    if seer is None:
        raise SystemExit("no Seer config: pass --seer-config or ship seer_deploy/models/demos/demo/seer.json")
    examples = heldout_examples(args.n)
    order = sorted(range(args.n), key=lambda i: len(examples[i].prompt))
    examples = [examples[i] for i in order]
    prompts = [tok.encode_prompt(e.prompt) for e in examples]
    print(f"{args.n} held-out demo prompts, batches of {args.batch}, {args.loop} loop, {args.threads} threads, "
          f"Seer: {seer.detector} (margin {seer.margin})\n")
    print("| gen_length | run | seconds | passes | tokens processed | vs full | exact match | mean kept |")
    print("|---|---|---|---|---|---|---|---|")
    for G in args.gen_lengths:
        config = GenerationConfig(gen_length=G, steps=G)
        results: dict[str, dict[str, Any]] = {}
        full = min((run(model, args.loop, prompts, config, args.batch, None, None) for _ in range(args.repeats)),
                   key=lambda r: r["seconds"])
        true_len = np.maximum(1, true_lengths(full["tokens"], {ckpt.config.eos_id}))
        results["full length"] = full
        best = min((run(model, args.loop, prompts, config, args.batch, seer, None) for _ in range(args.repeats)),
                   key=lambda r: r["seconds"])
        cut_at = np.minimum(true_len, G)
        results[f"seer {seer.detector}"] = best
        results["oracle (true length)"] = min(
            (run(model, args.loop, prompts, config, args.batch, None, cut_at) for _ in range(args.repeats)),
            key=lambda r: r["seconds"])
        for name, r in results.items():
            answers = [tok.decode_answer(row.tolist()) for row in r["tokens"]]
            exact = np.mean([a == e.answer for a, e in zip(answers, examples, strict=True)])
            print(f"| {G} | {name} | {r['seconds']:.2f} | {r['passes']} | {r['tokens_processed']:,} | "
                  f"{r['tokens_processed'] / full['tokens_processed']:.3f} | {exact:.3f} | {np.mean(r['kept']):.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
