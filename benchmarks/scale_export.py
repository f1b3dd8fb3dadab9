"""Export at scale (issue 34): a random checkpoint in LLaDA's layout at LLaDA-8B's exact shape (or fewer layers),
exported with `seer-deploy export --dtype fp16` (then with --kv-cache), measured as a user would meet it.

One run:
 1. writes the checkpoint (benchmarks/llada_checkpoint.py: LLaDA-8B-Instruct's config.json keys, its tensor names,
    bf16 shards of 4 GiB with an index, a BPE tokenizer.json at LLaDA's special ids), unless the same one is there;
 2. `seer-deploy export CKPT --out W/export --dtype fp16 --json` as one process: peak resident memory (the kernel's
    high-water mark, through benchmarks/measured.py), wall time, the time of each stage (from the --json progress
    lines), the disk it wrote, and the free disk it needed (checked before it ran, by the exporter itself);
 3. the same with --kv-cache (into the same directory: the first export is replaced);
 4. `seer-deploy generate W/export -p ... --gen-length 8 --steps 8 --json`: load time, time per step on this machine's
    cores, peak resident memory (a fact about CPUs and an 8B model, not a goal);
 5. writes W/scale-<shape>.json and prints a markdown table (BENCHMARKS.md's "Export at scale" section).

Everything is written under --work (default /tmp/scale_work), never in the repository. Not part of CI. At the full
shape: ~16 GB checkpoint + ~16 GB export on disk, ~25 min of export on 2 cores.

    .venv/bin/python benchmarks/scale_export.py [--layers 32] [--work /tmp/scale_work] [--no-kv-cache] [--no-generate]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from llada_checkpoint import LLADA_8B, Shape, is_current, write_checkpoint
from measured import Proc, run_measured

PY = sys.executable
SEER_CLI = ([str(Path(PY).parent / "seer-deploy")] if (Path(PY).parent / "seer-deploy").is_file()
            else [PY, "-c", "from seer_deploy.cli import main; main()"])
GiB = 2**30
SUMMARY = re.compile(r"prompts? on [^:]+: ([0-9.]+)s, ([0-9]+) forward passes")
PROMPT = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge"


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {msg}", flush=True)


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def stage_seconds(stderr: str) -> dict[str, float]:
    """Each stage's duration from `export --json`'s progress lines (the time between the first events of stages)."""
    starts: dict[str, float] = {}
    end = 0.0
    for line in stderr.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "stage" in event:
            starts.setdefault(event["stage"], float(event["elapsed_s"]))
            end = max(end, float(event["elapsed_s"]))
    names = list(starts)
    return {name: round((starts[names[k + 1]] if k + 1 < len(names) else end) - starts[name], 1)
            for k, name in enumerate(names)}


def export(ckpt: Path, out: Path, dtype: str, kv_cache: bool, extra: Sequence[str] = ()) -> dict[str, Any]:
    """`seer-deploy export` as one measured process (extra: more flags, e.g. --quantize int4 for quant_memory.py)."""
    cmd = [*SEER_CLI, "export", str(ckpt), "--out", str(out), "--dtype", dtype, "--json", "--force",
           *(["--kv-cache"] if kv_cache else []), *extra]
    free_before = shutil.disk_usage(out.parent).free
    log(f"$ {' '.join(cmd[-9:])}")
    p = run_measured(cmd, cwd=REPO)
    record: dict[str, Any] = {"command": "seer-deploy " + " ".join(cmd[len(SEER_CLI):]), "rc": p.rc,
                              "wall_s": round(p.wall_s, 1), "peak_rss_gib": round(p.peak_rss / GiB, 2),
                              "peak_rss_mib": round(p.peak_rss / 2**20), "stages_s": stage_seconds(p.err),
                              "free_disk_before_gib": round(free_before / GiB, 1)}
    if p.rc != 0:
        record["error"] = (p.err.strip().splitlines() or ["?"])[-1]
        log(f"export failed (rc {p.rc}): {record['error']}")
        return record
    result = json.loads(p.out.strip().splitlines()[-1])
    record.update(written_gib=round(tree_bytes(out) / GiB, 2), weights_gib=round(result["weights_bytes"] / GiB, 2),
                  verified=result["verified"], max_diff=result["max_diff"])
    log(f"  {record['wall_s']}s, peak RSS {record['peak_rss_gib']} GiB, wrote {record['written_gib']} GiB, "
        f"stages {record['stages_s']}")
    return record


def generate(out: Path, gen_length: int, prompts: Sequence[str] = (PROMPT,), extra: Sequence[str] = ()
             ) -> dict[str, Any]:
    """`seer-deploy generate` on the export as one measured process, all prompts in one batch."""
    cmd = [*SEER_CLI, "generate", str(out), *(a for p in prompts for a in ("-p", p)), "--gen-length",
           str(gen_length), "--steps", str(gen_length), "--block-length", str(gen_length), "--no-seer", "--json",
           *extra]
    log(f"$ seer-deploy generate {out} ({len(prompts)} prompts) --gen-length {gen_length} {' '.join(extra)}")
    p: Proc = run_measured(cmd, cwd=REPO)
    record: dict[str, Any] = {"command": "seer-deploy " + " ".join(cmd[len(SEER_CLI):]), "rc": p.rc,
                              "wall_s": round(p.wall_s, 1), "peak_rss_gib": round(p.peak_rss / GiB, 2),
                              "peak_rss_mib": round(p.peak_rss / 2**20)}
    if p.rc != 0:
        record["error"] = (p.err.strip().splitlines() or ["?"])[-1]
        return record
    run = json.loads(p.out.strip().splitlines()[-1])
    summary = SUMMARY.search(p.err)  # "N prompts on BACKEND: S.SSs, P forward passes"
    record.update(load_s=run["load_s"], first_step_s=run["first_step_s"], answer_tokens=run["tokens"])
    if summary:
        seconds, passes = float(summary[1]), int(summary[2])
        record.update(seconds=seconds, passes=passes, s_per_pass=round(seconds / max(passes, 1), 2))
    log(f"  {record}")
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/scale_work"))
    ap.add_argument("--layers", type=int, default=LLADA_8B.n_layers, help="transformer layers (LLaDA-8B: 32)")
    ap.add_argument("--d-model", type=int, default=LLADA_8B.d_model)
    ap.add_argument("--mlp-hidden", type=int, default=LLADA_8B.mlp_hidden)
    ap.add_argument("--heads", type=int, default=LLADA_8B.n_heads)
    ap.add_argument("--vocab", type=int, default=LLADA_8B.vocab)
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "fp32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bpe-vocab", type=int, default=8000)
    ap.add_argument("--no-kv-cache", action="store_true", help="skip the --kv-cache export")
    ap.add_argument("--no-generate", action="store_true", help="skip `generate` on the export")
    ap.add_argument("--gen-length", type=int, default=8)
    args = ap.parse_args()
    shape = Shape(args.d_model, args.layers, args.mlp_hidden, args.heads, args.vocab)
    work = args.work.resolve()
    if work == REPO or REPO in work.parents:
        ap.error("--work must lie outside the repository")
    work.mkdir(parents=True, exist_ok=True)
    ckpt, out = work / f"checkpoint-{shape.tag}", work / "export"
    log(f"shape {shape.tag}: {shape.params / 1e9:.2f}B parameters, {shape.params * 2 / GiB:.1f} GiB in bf16")
    record: dict[str, Any] = {"shape": shape.__dict__, "parameters": shape.params, "machine": {
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB, 1)},
        "date": datetime.now(UTC).isoformat(timespec="seconds")}
    t = time.perf_counter()
    if not is_current(ckpt, shape, args.seed, args.bpe_vocab, 4096):
        log("writing the random checkpoint")
        write_checkpoint(ckpt, shape, 4096, args.seed, args.bpe_vocab, log=log)
    record["checkpoint"] = {"seconds": round(time.perf_counter() - t, 1), "gib": round(tree_bytes(ckpt) / GiB, 2)}
    record["export"] = export(ckpt, out, args.dtype, kv_cache=False)
    if not args.no_generate and record["export"]["rc"] == 0:
        record["generate"] = generate(out, args.gen_length)
    if not args.no_kv_cache:
        record["export_kv_cache"] = export(ckpt, out, args.dtype, kv_cache=True)
    path = work / f"scale-{shape.tag}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {path}")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
