"""Accuracy of the fast path on many held-out demo prompts: full length, the peers' recipe, Seer + both, and
progressive step zero (first canvases), on the torch backend through the runtime loop (the bench measures speed on 8
prompts; this measures answers on hundreds).

    python scripts/fast_path_study.py --prompts 200 --gen-length 256 --canvases 32,64 --threads 1

Prints one markdown row per setting: exact match, identity to full length (fixed schedule, step zero at full length,
no cache), forward passes and seconds.
"""

from __future__ import annotations

import argparse
import time

import torch

from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--canvases", default="32,64")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint("demo")
    cfg = ckpt.config
    tok = Tokenizer.from_checkpoint(ckpt.path, cfg.eos_id)
    examples = heldout_examples(args.prompts)
    prompts = [tok.encode_prompt(e.prompt) for e in examples]
    seer = SeerConfig.load(ckpt.path / "seer.json")
    backend = TorchBackend(ckpt.model, seer.stats_spec(cfg.n_layers))
    G = args.gen_length
    fast = GenerationConfig(G, G, block_length=args.block_length, decode="threshold", threshold=args.threshold,
                            kv_cache=True)
    settings: list[tuple[str, GenerationConfig, SeerConfig | None]] = [
        ("full length (fixed, one block)", GenerationConfig(G, G), None),
        (f"threshold {args.threshold:g}, block {args.block_length}, no cache", GenerationConfig(
            G, G, block_length=args.block_length, decode="threshold", threshold=args.threshold), None),
        ("Fast-dLLM: threshold + dual cache", fast, None),
        ("Seer (shipped config)", GenerationConfig(G, G), seer),
        ("Seer + threshold + dual cache", fast, seer),
        *((f"... + first canvas {c}", fast, seer.with_(first_canvas=int(c))) for c in args.canvases.split(",")),
    ]
    print(f"{args.prompts} held-out demo prompts, gen_length {G}, batch {args.batch}, torch {args.threads} thread(s)")
    print()
    print("| setting | exact | = full length | passes | seconds |")
    print("|---|---:|---:|---:|---:|")
    reference: list[str] | None = None
    for name, config, seer_config in settings:
        answers: list[str] = []
        passes = 0
        start = time.perf_counter()
        for lo in range(0, len(prompts), args.batch):
            out = run_generation(backend, prompts[lo : lo + args.batch], config, ids=SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id), seer=seer_config)
            answers += [tok.decode_answer(row.tolist()) for row in out.tokens]
            passes += out.passes
        seconds = time.perf_counter() - start
        reference = reference or answers
        exact = sum(a == e.answer for a, e in zip(answers, examples, strict=True)) / len(examples)
        same = sum(a == r for a, r in zip(answers, reference, strict=True)) / len(examples)
        print(f"| {name} | {exact:.3f} | {same:.3f} | {passes} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
