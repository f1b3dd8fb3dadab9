"""Held-out exact match of a demo checkpoint with the reference loop, per task and overall.

    python scripts/eval_demo.py --checkpoint demo --prompts 200 --gen-lengths 64,256

steps = gen_length and block_length = gen_length (LLaDA's one-token-per-step setting), temperature 0.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.reference import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="demo")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--gen-lengths", default="64,256")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(args.checkpoint)
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id)
    examples = heldout_examples(args.prompts)
    for gen_length in (int(g) for g in args.gen_lengths.split(",")):
        start = time.perf_counter()
        hits: Counter[str] = Counter()
        totals: Counter[str] = Counter()
        for lo in range(0, len(examples), args.batch):
            chunk = examples[lo : lo + args.batch]
            out = generate(ckpt.model, [tok.encode_prompt(e.prompt) for e in chunk], GenerationConfig(gen_length, gen_length))
            for e, row in zip(chunk, out.tokens, strict=True):
                totals[e.task] += 1
                hits[e.task] += tok.decode_answer(row.tolist()) == e.answer
        per_task = ", ".join(f"{t} {hits[t] / totals[t]:.3f}" for t in sorted(totals))
        print(
            f"gen_length {gen_length}: exact match {sum(hits.values()) / len(examples):.3f} "
            f"({sum(hits.values())}/{len(examples)}; {per_task}) in {time.perf_counter() - start:.0f}s",
            flush=True,
        )


if __name__ == "__main__":
    main()
