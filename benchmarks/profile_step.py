"""Where a step's time goes, by operator, from ONNX Runtime's own profiler (issue 48, item 2).

Opens an export's step graph on the CPU as `generate` does (shared weights, prepacking where the backend prepacks),
runs step zero and a few steps over a prompt and a masked response (every response slot a candidate), and sums
the profiler's kernel times by operator type (MatMulNBits, MatMul, the head's reductions, ...), per export:

    .venv/bin/python benchmarks/profile_step.py EXPORT_DIR [EXPORT_DIR ...] --threads 2 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def profile(export_dir: Path, threads: int, prompt: int, response: int, steps: int) -> dict[str, Any]:
    from seer_deploy.core.backend import StepInput
    from seer_deploy.engines import ort_sessions
    from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions

    prefix = Path(tempfile.mkdtemp()) / "profile"
    plain = ort_sessions.OrtSessionOptions.session_options

    def profiled(self: Any) -> Any:
        so = plain(self)
        so.enable_profiling = True
        so.profile_file_prefix = str(prefix)
        return so

    ort_sessions.OrtSessionOptions.session_options = profiled  # type: ignore[method-assign]
    backend = OrtBackend(export_dir, OrtSessionOptions(providers=("CPUExecutionProvider",), intra_op_threads=threads),
                         kv_cache=False)
    mask_id = json.loads((export_dir / "manifest.json").read_text())["special_ids"]["mask"]
    ids = np.full((1, prompt + response), mask_id, dtype=np.int64)
    ids[0, :prompt] = 5
    columns = np.arange(prompt, prompt + response)[None, :]
    backend.step0(StepInput(ids, candidates=columns))
    for _ in range(steps):
        backend.step(StepInput(ids, candidates=columns))
    trace = Path(backend._sessions["step"].end_profiling())
    by_op: dict[str, float] = defaultdict(float)
    for event in json.loads(trace.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"].get("op_name", "?")] += event["dur"] / 1e6
    total = sum(by_op.values())
    shares = {op: {"s": round(s, 3), "share": round(s / total, 3)} for op, s in
              sorted(by_op.items(), key=lambda kv: -kv[1])}
    return {"export": str(export_dir), "kernel_s": round(total, 3), "calls": steps + 1, "by_op": shares}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exports", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="steps after step zero")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results = []
    for export_dir in args.exports:
        result = profile(export_dir.resolve(), args.threads, args.prompt, args.response, args.steps)
        top = ", ".join(f"{op} {v['share']:.0%}" for op, v in list(result["by_op"].items())[:6])
        print(f"{export_dir.name}: {result['kernel_s']:.2f} s of kernels over {result['calls']} calls: {top}")
        results.append(result)
    if args.out is not None:
        head = subprocess.run(["git", "log", "-1", "--format=%h"], capture_output=True, text=True, cwd=REPO,
                              check=False).stdout.strip()
        args.out.write_text(json.dumps({"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": head,
                                        "command": " ".join([os.path.relpath(sys.executable, REPO), *sys.argv]),
                                        "loadavg_1min_after": os.getloadavg()[0], "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
