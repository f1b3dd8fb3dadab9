"""What an optimization profile costs: TensorRT-RTX build time and engine size per graph and per number of buckets.

Exports the demo (fp32 and fp16, with the KV cache graphs), then builds each graph's engine without a GPU with the
project's own profile plans (`engines.build.tensorrt_plans`) for 1, 2 and 5 buckets (default window lengths, so the
window graph gets one profile per reachable (bucket, window) pair), and prints a markdown table (and JSON with
--json). Run from the repository root:

    PYTHONPATH=. python benchmarks/trt_build_cost.py --out /tmp/trt-cost

The fp16 export skips its own check for now (--no-verify): the fp16 tolerance is being reworked (issue 30).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from seer_deploy.engines.build import BuildOptions, prepare_build
from seer_deploy.engines.tensorrt_build import TensorRTBuildOptions, build_serialized_engine
from seer_deploy.engines.tensorrt_library import load_library
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions

BUCKETS = {1: (160,), 2: (64, 160), 5: (16, 32, 64, 128, 160)}  # the demo's default plan is the 5-bucket one


def measure(out: Path, repeats: int) -> list[dict[str, object]]:
    lib = load_library("tensorrt_rtx")
    rows: list[dict[str, object]] = []
    for dtype in ("fp32", "fp16"):
        export = export_checkpoint("demo", out / f"demo-{dtype}", ExportOptions(dtype=dtype, kv_cache=True)).out
        for count, buckets in BUCKETS.items():
            run = prepare_build(export, out / "unused", BuildOptions(backend="tensorrt", trt_library="tensorrt_rtx",
                                                                     buckets=buckets))
            for graph, profiles in run.plans.items():
                seconds = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    plan = build_serialized_engine(lib, export / run.export.graphs[graph].file, graph, profiles,
                                                   TensorRTBuildOptions(), lambda _: None)
                    seconds.append(time.perf_counter() - started)
                rows.append({"dtype": dtype, "graph": graph, "buckets": count, "profiles": len(profiles),
                             "seconds": min(seconds), "mb": len(plan) / 1e6})
                print(f"{dtype} {graph:12s} {count} buckets {len(profiles):2d} profiles "
                      f"{min(seconds):5.1f} s {len(plan) / 1e6:6.1f} MB", flush=True)
    return rows


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| dtype | graph | buckets | profiles | build s | engine MB |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['dtype']} | {r['graph']} | {r['buckets']} | {r['profiles']} | {r['seconds']:.1f} | "
              f"{r['mb']:.1f} |" for r in rows]
    return "\n".join(lines)


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="a scratch directory for the exports")
    parser.add_argument("--repeats", type=int, default=1, help="builds per row; the fastest is reported")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = measure(args.out, args.repeats)
    print(f"\nTensorRT-RTX {load_library('tensorrt_rtx').version}, {cpu_name()} ({os.cpu_count()} cores), no GPU\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
