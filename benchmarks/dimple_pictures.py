"""Dimple with pictures, measured (issue 44): the vision graph's cost per picture size, and Seer's row on a tiny
Dimple-layout checkpoint with pictures (`seer-deploy bench`).

  vision  vision.onnx of a Qwen2.5-VL tower at Qwen2.5-VL-7B's width (1280 wide, 16 heads, MLP 3420, merger into
          3584, Dimple-7B's projector into 3584) with --depth blocks (random weights; the real tower has 32, every
          8th with full attention), exported with seer-deploy's tracing, then timed on ONNX Runtime and torch per
          picture size (every picture resized by Qwen's rules, max_pixels 28*28*1280 as Dimple's processor): the
          median of --repeats calls after one warm-up, and the seconds per block (the cost grows with the blocks).
  bench   writes the tiny Dimple-layout checkpoint of the tests (tests/dimple_checkpoint.py: public names, random
          weights) and runs `seer-deploy bench` on it (held-out demo-vl pictures): tokens processed and passes with
          Seer against full length.

Each writes its raw JSON under benchmarks/results-dimple/ with the command, commit and date.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results-dimple"
SIZES = "224x224,448x224,448x448,672x672"  # width x height of the pictures timed (--sizes)


def provenance() -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    return {"commit": commit.stdout.strip(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": "PYTHONPATH=. .venv/bin/python benchmarks/dimple_pictures.py " + " ".join(sys.argv[1:]),
            "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_average": os.getloadavg(),
                        "note": "a shared machine: other sessions were running"}}


def vision_cost(depth: int, repeats: int, threads: int, sizes: list[tuple[int, int]]) -> dict[str, Any]:
    import onnx_ir as ir
    import onnxruntime as ort
    import torch

    from seer_deploy.contracts.graphs import QWEN_VISION, Axis
    from seer_deploy.export.graphs import DimpleVisionGraph
    from seer_deploy.export.trace import trace_graph
    from seer_deploy.models.networks.qwen_vision import DimpleVisionEncoder, QwenTowerConfig
    from seer_deploy.models.pictures.qwen_layout import tower_inputs
    from seer_deploy.models.pictures.qwen_pictures import QwenPictureConfig

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    full = tuple(i for i in range(depth) if i % 8 == 7) or (depth - 1,)
    tower = QwenTowerConfig(depth=depth, fullatt_block_indexes=full)
    encoder = DimpleVisionEncoder(tower, 3584).eval()
    pictures = QwenPictureConfig()  # Dimple's processor defaults: max_pixels 28*28*1280
    rng = np.random.default_rng(0)

    def feed(width: int, height: int) -> dict[str, np.ndarray]:
        grid = pictures.grid(width, height)
        patches = rng.standard_normal((grid[1] * grid[2], tower.patch_dim)).astype(np.float32)
        return tower_inputs([patches], [grid], tower.geometry)

    work = Path(tempfile.mkdtemp(prefix="dimple-vision-"))
    started = time.perf_counter()
    example = feed(112, 56)
    model = trace_graph(DimpleVisionGraph(encoder), tuple(torch.from_numpy(example[n]) for n in QWEN_VISION.input_names),
                        QWEN_VISION, 18, {Axis.IMAGE_TOKENS: 1 << 20})
    ir.save(model, work / "vision.onnx", external_data="vision.onnx.data")
    export_s = time.perf_counter() - started
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    session = ort.InferenceSession(str(work / "vision.onnx"), so, providers=["CPUExecutionProvider"])
    rows = []
    for width, height in sizes:
        inputs = feed(width, height)
        tokens = len(inputs["restore_order"])
        times: dict[str, list[float]] = {"ort": [], "torch": []}
        for _ in range(repeats + 1):  # the first call of each is a warm-up
            t = time.perf_counter()
            session.run(None, inputs)
            times["ort"].append(time.perf_counter() - t)
            with torch.no_grad():
                t = time.perf_counter()
                encoder(**{k: torch.from_numpy(v) for k, v in inputs.items()})
                times["torch"].append(time.perf_counter() - t)
        medians = {k: statistics.median(v[1:]) for k, v in times.items()}
        rows.append({"picture": f"{width}x{height}", "resized": [pictures.resized(width, height)[1],
                                                                   pictures.resized(width, height)[0]],
                     "patches": tokens * 4, "image_tokens": tokens,
                     "ort_s": round(medians["ort"], 4), "torch_s": round(medians["torch"], 4),
                     "ort_s_per_block": round(medians["ort"] / depth, 4), "ort_runs_s": [round(x, 4) for x in times["ort"]]})
        print(rows[-1], file=sys.stderr)
    params = sum(p.numel() for p in encoder.parameters())
    return {"tower": tower.to_dict(), "lm_width": 3584, "parameters": params, "threads": threads, "repeats": repeats,
            "export_s": round(export_s, 1), "rows": rows}


def bench(prompts: int, gen_lengths: str, batch_sizes: str, threads: int, repeats: int) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from dimple_checkpoint import write_dimple

    work = Path(tempfile.mkdtemp(prefix="dimple-bench-"))
    path, _, _ = write_dimple(work)
    out = RESULTS / "bench"
    command = [sys.executable, "-c", "from seer_deploy.cli import main; main()", "bench", str(path),
               "--gen-lengths", gen_lengths, "--batch-sizes", batch_sizes, "--prompts", str(prompts),
               "--threads", str(threads), "--repeats", str(repeats), "--quantize", "none", "--no-tensorrt", "--no-scaling", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out / "bench.json"


def render() -> str:
    """The vision-cost table(s) from the JSON files (RESULTS/vision-cost.md)."""
    out: list[str] = []
    for path in sorted(RESULTS.glob("vision-cost-depth*.json")):
        data = json.loads(path.read_text())
        t, m = data["tower"], data["machine"]
        out += [(f"Command: `{data['command']}` (commit {data['commit'][:7]}, {data['date']}; {m['cpu']}, "
                f"{m['cores']} cores, load average {m['load_average'][0]:.1f}: other sessions were running; "
                f"{data['threads']} threads, median of {data['repeats']} calls after a warm-up). Tower: "
                f"{t['depth']} blocks of width {t['hidden_size']} ({t['num_heads']} heads, MLP {t['intermediate_size']}, "
                f"full attention in {t['fullatt_block_indexes']}), merger into {t['out_hidden_size']}, projector into "
                f"{data['lm_width']}: {data['parameters'] / 1e6:.0f}M parameters, random weights; vision.onnx "
                f"exported in {data['export_s']} s."), "",
                "| picture (px) | resized to | patches | image tokens | ONNX Runtime s | per block s | torch s |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {r['picture']} | {r['resized'][0]}x{r['resized'][1]} | {r['patches']} | {r['image_tokens']} | "
                f"{r['ort_s']:.3f} | {r['ort_s_per_block']:.3f} | {r['torch_s']:.3f} |" for r in data["rows"]]
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["vision", "bench", "render", "stamp"],
                    help="stamp: add the commit, date and machine to a bench.json run by hand (--bench-json)")
    ap.add_argument("--bench-json", type=Path, default=RESULTS / "bench" / "bench.json")
    ap.add_argument("--depth", type=int, default=4, help="vision: the tower's blocks (Qwen2.5-VL-7B has 32)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default=SIZES, help="vision: the pictures' sizes, WxH,...")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--gen-lengths", default="32,64")
    ap.add_argument("--batch-sizes", default="1,4")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.part == "render":
        (RESULTS / "vision-cost.md").write_text(render())
        print((RESULTS / "vision-cost.md").read_text())
        return
    record = provenance()
    if args.part == "stamp":
        path = args.bench_json
        path.write_text(json.dumps(json.loads(path.read_text()) | {"provenance": record}, indent=1) + "\n")
    elif args.part == "vision":
        path = RESULTS / f"vision-cost-depth{args.depth}.json"
        sizes = [(int(w), int(h)) for w, h in (size.split("x") for size in args.sizes.split(","))]
        path.write_text(json.dumps(record | vision_cost(args.depth, args.repeats, args.threads, sizes), indent=1)
                        + "\n")
    else:
        path = bench(args.prompts, args.gen_lengths, args.batch_sizes, args.threads, args.repeats)
        path.write_text(json.dumps(json.loads(path.read_text()) | {"provenance": record}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
