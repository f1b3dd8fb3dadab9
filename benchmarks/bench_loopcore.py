"""Host time per denoising step of the loop core: the C extension against its numpy twin.

One step's host work is the stop test (`masks_left`) and the commit (`commit_step`) on the sequence the engine ran:
a 64-token prompt plus the kept response length, half of it still masked, committing kept/32 tokens (at least 1) by
confidence. A second table times parallel decoding's step: the stop test and `commit_confident` with the rank
thresholds of `--decode threshold --threshold 0.9` on log-probability confidences. Prints markdown tables of median
microseconds per step.

    python benchmarks/bench_loopcore.py [--repeats 300]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.runtime.loopcore import c_core, python_core

PROMPT = 64
MASK = 3


@dataclass(frozen=True)
class Case:
    batch: int
    kept: int


def make_inputs(case: Case, rng: np.random.Generator) -> dict[str, Any]:
    S = PROMPT + case.kept
    x = rng.integers(10, 1000, size=(case.batch, S), dtype=np.int64)
    masked = rng.random((case.batch, case.kept)) < 0.5
    x[:, PROMPT:][masked] = MASK
    return {
        "x": x,
        "x0": rng.integers(10, 1000, size=(case.batch, S), dtype=np.int64),
        "confidence": rng.random((case.batch, S), dtype=np.float32),
        "block_lo": np.zeros(case.batch, np.int64),
        "block_hi": np.full(case.batch, S, np.int64),
        "k": np.full(case.batch, max(1, case.kept // 32), np.int64),
    }


def make_confident_inputs(case: Case, rng: np.random.Generator) -> dict[str, Any]:
    """The same sequence, scored by log-probabilities (about 10% of candidates clear 0.9) and ranked by thresholds."""
    inputs = make_inputs(case, rng)
    del inputs["k"]
    inputs["confidence"] = np.log(rng.random(inputs["x"].shape)).astype(np.float32)
    config = GenerationConfig(decode="threshold", threshold=0.9)
    inputs["thresholds"] = config.rank_thresholds(inputs["x"].shape[1])
    return inputs


def time_step(core: Any, inputs: dict[str, Any], repeats: int) -> float:
    """Median microseconds of masks_left + the commit (commit_step, or commit_confident when inputs carry
    thresholds), each call on a fresh copy of x."""
    template = inputs["x"]
    x = template.copy()
    rest = {k: v for k, v in inputs.items() if k != "x"}
    commit = core.commit_confident if "thresholds" in inputs else core.commit_step
    samples = []
    for _ in range(repeats):
        np.copyto(x, template)
        t0 = time.perf_counter_ns()
        core.masks_left(x, inputs["block_lo"], inputs["block_hi"], MASK)
        commit(x, mask_id=MASK, **rest)
        samples.append(time.perf_counter_ns() - t0)
    return float(np.median(samples)) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    compiled = c_core()
    if compiled is None:
        raise SystemExit("the C extension is not built; run `pip install -e .` with a C compiler first")
    twin = python_core()
    rng = np.random.default_rng(0)
    for title, make in (
        ("commit_step (top k)", make_inputs),
        ("commit_confident (threshold 0.9)", make_confident_inputs),
    ):
        print(f"\n{title}\n")
        print("| batch | kept length | sequence | C core (us/step) | numpy twin (us/step) | speedup |")
        print("|---:|---:|---:|---:|---:|---:|")
        for batch in (1, 8):
            for kept in (32, 64, 128, 256, 512, 1024):
                inputs = make(Case(batch, kept), rng)
                c_us = time_step(compiled, inputs, args.repeats)
                py_us = time_step(twin, inputs, args.repeats)
                print(f"| {batch} | {kept} | {PROMPT + kept} | {c_us:.1f} | {py_us:.1f} | {py_us / c_us:.1f}x |")


if __name__ == "__main__":
    main()
