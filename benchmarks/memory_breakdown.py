"""Where a run's memory and its time to first step go, stage by stage (issue 48, items 1 and 3).

Each export runs `generate` once in a fresh process (the CLI's own path: `Service(export).generate(...)`), which
records at every stage the time since the process was spawned and its memory from /proc/self/smaps: resident total,
anonymous (what the process allocated: libraries' heaps, prepacked weights, activations, the arena) and the pages of
the memory-mapped weights file, split by initializer (embedding, LM head, the rest), plus the high-water mark. Stages:

  interpreter    the bare interpreter (nothing of seer-deploy imported)
  imports        `seer_deploy.service` and the libraries it pulls in (onnxruntime, numpy, tokenizers, ...)
  opened         `Service(export)`: manifest, Seer config, backend object, tokenizer (sessions open lazily)
  sessions       the step graph's ONNX Runtime session opened (weights mapped; prepacked where the backend prepacks)
  step 0         the first pass done (the step zero statistics and the LM head over every candidate column)
  step 1         the second pass
  last step      the run's last pass

Differences between stages give the breakdown BENCHMARKS.md shows ("Memory and first step, component by
component"). Run:

    .venv/bin/python benchmarks/memory_breakdown.py EXPORT_DIR [EXPORT_DIR ...] --out benchmarks/results-footprint/breakdown.json
    .venv/bin/python benchmarks/memory_breakdown.py --render benchmarks/results-footprint/breakdown*.json   # table.md

(gen_length 256 in one block, 64 steps, 2 threads, Seer off, a 32-id prompt: the llama.cpp comparison's run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MiB = 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")
PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 3)


# ---------------------------------------------------------------------------------------------------------------------
# the child: one run, measured from inside


def smaps_kib(weights_file: str) -> dict[str, int]:
    """Resident KiB of the process: total, anonymous, file-backed, and of the weights file's mappings."""
    totals = {"rss": 0, "anon": 0, "weights_file": 0}
    current = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split(None, 5)
                current = parts[5].strip() if len(parts) > 5 else ""
            elif line.startswith("Rss:"):
                kib = int(line.split()[1])
                totals["rss"] += kib
                if weights_file and current == weights_file:
                    totals["weights_file"] += kib
            elif line.startswith("Anonymous:"):
                totals["anon"] += int(line.split()[1])
    return totals


def peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def resident_pages(address: int, length: int) -> int:
    """Pages of [address, address + length) resident in this process (/proc/self/pagemap's present bit)."""
    first, last = address // PAGE, (address + length - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    import numpy as np

    return int(((np.frombuffer(raw, dtype=np.uint64) >> np.uint64(63)) & np.uint64(1)).sum())


def child(export_dir: Path, spawn: float, threads: int, gen_length: int, steps: int,
          ranges: dict[str, list[tuple[int, int]]]) -> dict[str, Any]:
    """`ranges`: part of the weights file -> its (offset, length) spans (computed by the parent: no onnx here)."""
    stages: list[dict[str, Any]] = []
    weights_path = ""
    mapping_address = [0]

    def mark(stage: str) -> None:
        kib = smaps_kib(weights_path)
        row: dict[str, Any] = {"stage": stage, "t_s": round(time.time() - spawn, 3),
                               **{f"{k}_mib": round(v / 1024, 1) for k, v in kib.items()},
                               "peak_mib": round(peak_kib() / 1024, 1)}
        if mapping_address[0]:
            row["weights_resident_mib"] = {part: round(sum(resident_pages(mapping_address[0] + o, n)
                                                           for o, n in spans) * PAGE / MiB, 1)
                                           for part, spans in ranges.items()}
        stages.append(row)

    mark("interpreter")
    import seer_deploy.service as service_module  # the CLI's path
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.runtime.targets import TargetOptions
    from seer_deploy.seer.options import SeerOptions

    Service, ServiceOptions = service_module.Service, service_module.ServiceOptions
    prompt_type = service_module.Prompt

    mark("imports")
    options = ServiceOptions(generation=GenerationConfig(gen_length=gen_length, steps=steps, block_length=gen_length),
                             target=TargetOptions(threads=threads), seer=SeerOptions(on=False))
    service = Service(export_dir, options)
    backend: Any = service.backend
    weights_path = str(backend.weights.file.resolve())
    mark("opened")
    backend.open_sessions() if not backend.supports_cache else backend._session_of(backend._step_io)
    if backend.weights.mapping is not None:
        mapping_address[0] = backend.weights.mapping.ctypes.data
    mark("sessions")
    calls = [0]
    total = steps

    def measured(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            calls[0] += 1
            if calls[0] in (1, 2, total):
                mark({1: "step 0", 2: "step 1"}.get(calls[0], "last step"))
            return out
        return call

    backend.step0, backend.step = measured(backend.step0), measured(backend.step)
    run = service.generate([prompt_type(PROMPT)])
    return {"stages": stages, "passes": getattr(run, "passes", None) or run.steps_run, "tokens": run.answers[0].tokens,
            "service": {"load_s": run.load_seconds, "first_step_s": run.first_step_seconds},
            "modules": sorted(m for m in ("torch", "onnx", "onnx_ir", "ml_dtypes", "transformers", "PIL", "scipy")
                              if m in sys.modules)}


def weight_parts(export_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """Byte spans of the weights file by part: the embedding, the LM head (its weight or its quantized parts), the
    rest; read from the step graph's initializers."""
    import onnx

    parts: dict[str, list[tuple[int, int]]] = {"embedding": [], "lm_head": [], "rest": []}
    for init in onnx.load(str(export_dir / "step.onnx"), load_external_data=False).graph.initializer:
        ext = {e.key: e.value for e in init.external_data}
        if "offset" not in ext:
            continue
        part = "embedding" if ".embed." in init.name else "lm_head" if ".lm_head." in init.name else "rest"
        parts[part].append((int(ext["offset"]), int(ext["length"])))
    return parts


# ---------------------------------------------------------------------------------------------------------------------
# the parent: one fresh process per export


def measure(export_dir: Path, threads: int, gen_length: int, steps: int) -> dict[str, Any]:
    ranges = json.dumps(weight_parts(export_dir))
    spawn = time.time()
    p = subprocess.run([sys.executable, __file__, "--child", str(export_dir), "--spawn", repr(spawn), "--threads",
                        str(threads), "--gen-length", str(gen_length), "--steps", str(steps), "--ranges", ranges],
                       capture_output=True, text=True, check=False, cwd=REPO)
    if p.returncode != 0:
        raise SystemExit(f"{export_dir}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    manifest = json.loads((export_dir / "manifest.json").read_text())
    weights = manifest["weights"]
    result.update(export=str(export_dir), dtype=manifest.get("dtype"), weights_mib=round(weights["bytes"] / MiB, 1),
                  quantization=weights.get("quantization"))
    return result


def git_head() -> str:
    """The commit of the seer-deploy code the runs import (PYTHONPATH may point at another tree than this script's)."""
    import seer_deploy

    tree = Path(seer_deploy.__file__).resolve().parents[1]
    head = subprocess.run(["git", "log", "-1", "--format=%h %s"], capture_output=True, text=True, cwd=tree,
                          check=False).stdout.strip()
    return f"{head} ({tree})"


def table(results: list[dict[str, Any]]) -> str:
    rows = [("| export | weights file MiB | stage | s since spawn | RSS MiB | anonymous MiB | weights file resident MiB "
            "(embedding / head / rest) | peak MiB |"), "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        name = Path(r["export"]).name
        for s in r["stages"]:
            parts = s.get("weights_resident_mib")
            split = f" ({parts['embedding']} / {parts['lm_head']} / {parts['rest']})" if parts else ""
            rows.append(f"| {name} | {r['weights_mib']} | {s['stage']} | {s['t_s']:.2f} | {s['rss_mib']} | "
                        f"{s['anon_mib']} | {s['weights_file_mib']}{split} | {s['peak_mib']} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exports", nargs="*", type=Path)
    ap.add_argument("--render", type=Path, nargs="+", default=None,
                    help="raw JSON files this script wrote: their tables, as table.md beside the first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="raw JSON (with the commit and date) to write")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spawn", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--ranges", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.render:
        parts = []
        for source in args.render:
            record = json.loads(source.read_text())
            parts += [(f"`{source.name}`: {record['date']}, {record['cpu']}, code at {record['commit']}; command: "
                      f"`{record['command']}`; 1-minute load average after the runs {record['loadavg_1min_after']:.1f}."),
                      "", table(record["results"]), ""]
        out = args.render[0].parent / "table.md"
        out.write_text("\n".join(parts))
        print(f"written: {out}")
        return
    if args.child:
        print(json.dumps(child(args.exports[0], args.spawn, args.threads, args.gen_length, args.steps,
                               json.loads(args.ranges))))
        return
    results = [measure(e.resolve(), args.threads, args.gen_length, args.steps) for e in args.exports]
    print(table(results))
    if args.out is not None:
        record = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_head(),
                  "command": " ".join([os.path.relpath(sys.executable, REPO), *sys.argv]),
                  "cpu": cpu_name(), "loadavg_1min_after": os.getloadavg()[0], "results": results}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"written: {args.out}")


def cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")


if __name__ == "__main__":
    main()
