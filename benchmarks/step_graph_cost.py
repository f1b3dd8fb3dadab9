"""What a pass of the step graph costs with and without the work it can skip, side by side in one process: every
column a candidate or only the masked response, temperature 0 or sampling, step zero's statistics on or off.

    python benchmarks/step_graph_cost.py EXPORT_DIR --prompt 32 --response 256 --threads 2 --repeats 5

Prints the median seconds per call and the ratio to the plain greedy step on the masked response (what the loop
runs after step zero). One ONNX Runtime session, calls alternating between the variants.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.core.backend import StepInput
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export", type=Path)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--masked", type=int, default=None, help="masked response slots [default: all of them]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    manifest = ExportManifest.load(args.export)
    mask_id = int(manifest.special_ids["mask"])  # type: ignore[arg-type]
    P, G = args.prompt, args.response
    masked = G if args.masked is None else args.masked
    rng = np.random.default_rng(0)
    ids = rng.integers(0, manifest.model_config().vocab_size, (1, P + G))
    ids[0, P + G - masked :] = mask_id
    everything = None
    response = np.arange(P + G - masked, P + G, dtype=np.int64)[None, :]
    backend = OrtBackend(args.export, OrtSessionOptions(providers=("CPUExecutionProvider",),
                                                        intra_op_threads=args.threads))
    variants = {
        "greedy, masked columns (a step after step zero)": lambda: backend.step(StepInput(ids, candidates=response)),
        "greedy, every column": lambda: backend.step(StepInput(ids, candidates=everything)),
        "sampling (T=0.7), masked columns": lambda: backend.step(StepInput(ids, None, 0.7, 1, candidates=response)),
        "step zero: statistics on, masked columns": lambda: backend.step0(StepInput(ids, candidates=response)),
    }
    for run in variants.values():  # sessions open, arenas grow
        run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, run in variants.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    base = statistics.median(next(iter(times.values())))
    print(f"{args.export.name}: 1 x {P} prompt + {G} response ({masked} masked), {args.threads} threads, "
          f"median of {args.repeats}")
    print("| pass | s/call | / greedy on masked columns |")
    print("|---|---:|---:|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
