"""Step latency of the exported graphs on ONNX Runtime (CPU) against torch eager, at Seer's kept lengths.

A step runs on prompt + kept length, so the table covers S = prompt + {32, 64, 128, 256} at batch 1 and 8, for the
denoising step (token + confidence) and step zero (plus EOS probability and the sparsity rows). Both sides compute
the same compact outputs (torch through `TorchBackend`). Uses the bundled demo checkpoint when it exists, else a
random model of the demo's shape. Prints a markdown table of median milliseconds per call.

    python benchmarks/bench_step_latency.py [--threads 2] [--repeats 30] [--prompt 16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint, save_checkpoint
from seer_deploy.models.demos.demo_tasks import VOCAB, write_tokenizer
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.torch_backend import TorchBackend

KEPT = (32, 64, 128, 256)
BATCHES = (1, 8)
DEMO_DIR = Path(__file__).resolve().parents[1] / "seer_deploy" / "models" / "demos" / "demo"


def demo_shaped_config() -> ModelConfig:
    """The demo model's shape (scripts/train_demo.py), for when the trained checkpoint is not there."""
    ids = {tok: i for i, tok in enumerate(VOCAB)}
    return ModelConfig(
        vocab_size=len(VOCAB), d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, mlp_hidden=1024, max_seq_len=320,
        mask_id=ids["<|mdm_mask|>"], eos_id=ids["<|endoftext|>"], pad_id=ids["<|endoftext|>"],
        bos_id=ids["<|startoftext|>"],
    )


def checkpoint(scratch: Path) -> tuple[str, str]:
    """(checkpoint name or path, description)."""
    if (DEMO_DIR / "model.safetensors").is_file():
        return "demo", "the bundled demo checkpoint"
    torch.manual_seed(0)
    write_tokenizer(scratch / "tokenizer.json")
    path = save_checkpoint(MaskPredictor(demo_shaped_config()), scratch / "random", tokenizer_file=scratch / "tokenizer.json")
    return str(path), "a random model of the demo's shape (the demo checkpoint is not trained yet)"


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1e3 * statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="threads for both runtimes")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens in front of the kept response")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        name, description = checkpoint(scratch)
        export = export_checkpoint(name, scratch / "export")
        model = load_checkpoint(name).model
        cfg = model.cfg
        ort_backend = OrtBackend(export.out, OrtSessionOptions(providers=("CPUExecutionProvider",),
                                                               intra_op_threads=args.threads, inter_op_threads=1))
        torch_backend = TorchBackend(model)
        rng = np.random.default_rng(0)
        print(f"Step latency, {description} ({model.num_parameters() / 1e6:.2f}M parameters), prompt {args.prompt} "
              f"tokens, {args.threads} threads, ONNX Runtime {ort_backend.providers[0]} fp32 vs torch "
              f"{torch.__version__} eager; median of {args.repeats} calls, ms\n")
        print("| batch | S | torch step | ORT step | speed-up | torch step0 | ORT step0 | speed-up |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for batch in BATCHES:
            for kept in KEPT:
                S = args.prompt + kept
                if S > cfg.max_seq_len:
                    continue
                ids = rng.integers(0, cfg.vocab_size, (batch, S))
                ids[:, args.prompt :] = cfg.mask_id
                t_step = median_ms(partial(torch_backend.step, ids, None), args.repeats)
                o_step = median_ms(partial(ort_backend.step, ids, None), args.repeats)
                t_zero = median_ms(partial(torch_backend.step0, ids, None), args.repeats)
                o_zero = median_ms(partial(ort_backend.step0, ids, None), args.repeats)
                print(f"| {batch} | {S} | {t_step:.2f} | {o_step:.2f} | {t_step / o_step:.2f}x "
                      f"| {t_zero:.2f} | {o_zero:.2f} | {t_zero / o_zero:.2f}x |")


if __name__ == "__main__":
    main()
