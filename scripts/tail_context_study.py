"""How much of Seer's difference from full length is the cut tail? Run the Seer config with `tail_context` E (the
first E cut slots kept in the later steps' input as committed EOS) and compare with full length.

    python scripts/tail_context_study.py --gen-length 256 --tail-contexts 0 8 32 96 160 224 all

Full-length answers come from the study's cache (`scripts/seer_study.py`, the same file names), computed here if
missing (about 37 minutes for 500 prompts at 256 on 2 cores). Prints one Markdown row per E.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from seer_study import cached_full, end_to_end, run_batched

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoints.checkpoint import checkpoint_fingerprint, load_checkpoint, resolve_checkpoint
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.seer.config import CHECKPOINT_CONFIG_NAME, SeerConfig, parse_tail_context
from seer_deploy.seer.metrics import true_lengths

DEMO_SEER_FILE = resolve_checkpoint("demo") / CHECKPOINT_CONFIG_NAME  # the demo's shipped Seer config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="demo", help="checkpoint directory (default: the bundled demo)")
    ap.add_argument("--seer-config", type=Path, default=DEMO_SEER_FILE)
    ap.add_argument("--n", type=int, default=500, help="held-out prompts")
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--tail-contexts", type=parse_tail_context, nargs="+", default=[0, 32, 160, "all"],
                    help="counts of cut slots, or 'all'")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/seer_study"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(args.checkpoint)
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id)
    cache = args.cache / checkpoint_fingerprint(args.checkpoint)[:12]
    examples = heldout_examples(args.n)
    prompts = [tok.encode_prompt(e.prompt) for e in examples]
    G = args.gen_length
    config = GenerationConfig(gen_length=G, steps=G)
    seer = SeerConfig.load(args.seer_config)
    full, _ = cached_full(ckpt.model, prompts, config, cache, "eval", args.batch)
    true_len = true_lengths(full, {ckpt.config.eos_id})
    full_processed = sum((len(p) + G) * G for p in prompts)  # one pass a step, every slot, no padding
    print("| tail_context | exact match | identical to full | mean kept | tokens processed | vs full | seconds |")
    print("|---|---|---|---|---|---|---|")
    for context in args.tail_contexts:
        start = time.perf_counter()
        run = run_batched(ckpt.model, prompts, config, args.batch, seer=seer.with_(tail_context=context))
        row = end_to_end(f"{context}", run, full, true_len, examples, tok, full_processed, None)
        print(f"| {context} | {row['exact_match']:.3f} | {row['identical_to_full']:.3f} | {row['mean_kept']:.2f} | "
              f"{row['tokens_processed']:,} | {row['vs_full']:.3f} | {time.perf_counter() - start:.1f} |", flush=True)


if __name__ == "__main__":
    main()
