"""Batch throughput of hybrid execution after Seer's cut, against padding every row to the batch's longest kept
length and against running the rows one by one (demo model, ONNX Runtime, CPU).

Every mode runs the same held-out prompts with the same Seer config (step zero at full length for the whole batch):

  hybrid         the scheduler's choice with the step cost measured on this backend (measure_step_cost)
  hybrid-merged  the scheduler forced to merge every row of a batch (rows still leave when they finish)
  pad-longest    every row kept at the batch's longest kept length and run for its steps (the plain batched loop)
  one-by-one     batch 1, each prompt alone
  full           no Seer, batch as given (for scale)

Prints a markdown table (best of --repeats runs): seconds, prompts/s, forward passes, positions computed (padding
included) and real tokens processed. Needs the trained demo checkpoint, or --target an engine/export dir.

    python benchmarks/bench_hybrid.py [--prompts 64] [--batch 8] [--repeats 3] [--threads 2] [--target DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seer_deploy.core.backend import Backend
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.build import BuildOptions, build_engines
from seer_deploy.engines.ort import OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.runtime.loop import LoopOptions, run_generation
from seer_deploy.runtime.openers import open_target
from seer_deploy.runtime.scheduler import StepCost, measure_step_cost
from seer_deploy.runtime.targets import TargetInfo, TargetOptions, find_seer_config
from seer_deploy.seer.config import SeerConfig


@dataclass
class Measured:
    seconds: float
    passes: int
    positions: int
    tokens: int


def run_mode(backend: Backend, info: TargetInfo, prompts: list[list[int]], batch: int, config: GenerationConfig,
             seer: SeerConfig | None, kept: list[int] | None = None, cost: StepCost | None = None) -> Measured:
    passes = positions = tokens = 0
    start = time.perf_counter()
    for lo in range(0, len(prompts), batch):
        forced = None if kept is None else kept[lo : lo + batch]
        out = run_generation(backend, prompts[lo : lo + batch], config, ids=SpecialIds(mask=info.mask_id, pad=info.pad_id, eos=info.eos_id), seer=seer, kept_lengths=forced, options=LoopOptions(cost=cost))
        passes, positions, tokens = passes + out.passes, positions + out.positions_computed, tokens + out.tokens_processed
    return Measured(time.perf_counter() - start, passes, positions, tokens)


def detected_kept(backend: Backend, info: TargetInfo, prompts: list[list[int]], batch: int, config: GenerationConfig,
                  seer: SeerConfig) -> list[int]:
    kept: list[int] = []
    for lo in range(0, len(prompts), batch):
        out = run_generation(backend, prompts[lo : lo + batch], config, ids=SpecialIds(mask=info.mask_id, pad=info.pad_id, eos=info.eos_id), seer=seer)
        assert out.seer is not None
        kept.extend(r.kept for r in out.seer)
    return kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=None, help="default: gen-length")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0 = default)")
    ap.add_argument("--target", default=None, help="an engine or export dir [default: export + build the demo]")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        target = args.target
        if target is None:
            export = export_checkpoint("demo", Path(tmp) / "export").out
            session = OrtSessionOptions(providers=("CPUExecutionProvider",), intra_op_threads=args.threads)
            target = str(build_engines(export, export / "engine", BuildOptions(backend="ort", ort_session=session)).out)
        backend, info = open_target(target, options=TargetOptions(threads=args.threads or None))
        # The paper's cut: rows differ in width only without a tail context (with the whole tail in view every row
        # runs prompt + gen_length slots, and there is no width to schedule).
        seer = (find_seer_config(target) or SeerConfig()).with_(tail_context=0)
        tok = info.tokenizer()
        prompts = [tok.encode_prompt(ex.prompt) for ex in heldout_examples(args.prompts)]
        config = GenerationConfig(args.gen_length, args.steps or args.gen_length)
        cost = measure_step_cost(backend)
        run_mode(backend, info, prompts[: args.batch], args.batch, config, seer)  # warm-up
        kept = detected_kept(backend, info, prompts, args.batch, config, seer)
        longest = [max(kept[lo : lo + args.batch]) for lo in range(0, len(kept), args.batch) for _ in range(args.batch)]
        modes = {
            "hybrid": lambda: run_mode(backend, info, prompts, args.batch, config, seer, cost=cost),
            "hybrid-merged": lambda: run_mode(backend, info, prompts, args.batch, config, seer,
                                              cost=StepCost(a=1.0, b=1e-12)),
            "pad-longest": lambda: run_mode(backend, info, prompts, args.batch, config, None, kept=longest[: len(kept)]),
            "one-by-one": lambda: run_mode(backend, info, prompts, 1, config, seer),
            "full": lambda: run_mode(backend, info, prompts, args.batch, config, None),
        }
        results = {name: min((fn() for _ in range(args.repeats)), key=lambda m: m.seconds) for name, fn in modes.items()}

    print(f"{backend.name}, {args.prompts} held-out demo prompts, batch {args.batch}, gen_length {config.gen_length}, "
          f"steps {config.steps}; Seer: {seer.detector}, margin {seer.margin}; measured step cost a = "
          f"{cost.a * 1e3:.3f} ms/call, b = {cost.b * 1e6:.3f} us/position (a/b = {cost.a / cost.b:.0f} positions)")
    print(f"kept lengths: mean {np.mean(kept):.1f}, min {min(kept)}, max {max(kept)}; best of {args.repeats}\n")
    print("| mode | seconds | prompts/s | forward passes | positions computed | real tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, m in results.items():
        print(f"| {name} | {m.seconds:.3f} | {args.prompts / m.seconds:.1f} | {m.passes} | {m.positions} | {m.tokens} |")


if __name__ == "__main__":
    main()
