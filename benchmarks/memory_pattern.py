"""What ONNX Runtime's memory pattern costs a CPU run whose shapes repeat (issue 48, item 1).

`seer-deploy generate` over --prompts copies of one prompt at --batch-size 1, so every batch's step zero has the same
shape, in a fresh process per run, alternating: the tree's sessions (on the CPU: no memory pattern, see
engines/ort_sessions.py) and the same sessions with the memory pattern turned back on (ONNX Runtime's default; this
script's child sets it, nothing else changes). Per run: the peak RSS (the child's own ru_maxrss at exit), the wall
seconds and the answers' tokens, which must be the same in every run (the record is written either way; the script
then fails if they differ). Writes JSON with the command, commit and date.

    .venv/bin/python benchmarks/memory_pattern.py EXPORT_DIR [--prompts 2] [--steps 8] [--rounds 2] --out F.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing"  # compare.py's
GiB = 2**30

# The CLI, with the memory pattern as the sessions' options leave it ("tree") or turned back on ("pattern").
CHILD = """
import atexit, resource, sys
atexit.register(lambda: print("PEAK_RSS_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr))
if sys.argv[1] == "pattern":
    from seer_deploy.engines import ort_sessions
    plain = ort_sessions.OrtSessionOptions.session_options
    def with_pattern(self):
        so = plain(self)
        so.enable_mem_pattern = True
        return so
    ort_sessions.OrtSessionOptions.session_options = with_pattern
from seer_deploy.cli import main
sys.argv = ["seer-deploy", *sys.argv[2:]]
main()
"""


def run(variant: str, export: Path, prompts: int, steps: int, gen_length: int, threads: int) -> dict[str, object]:
    args = ["generate", str(export), *(["--prompt", PROMPT] * prompts), "--batch-size", "1", "--gen-length",
            str(gen_length), "--block-length", str(gen_length), "--steps", str(steps), "--threads", str(threads),
            "--no-seer", "--json"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, variant, *args], capture_output=True, text=True, cwd=REPO,
                          check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise SystemExit(f"{variant}: {last}")
    peak_kib = next(int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("PEAK_RSS_KIB"))
    return {"variant": variant, "seconds": round(seconds, 2), "peak_rss_gib": round(peak_kib * 1024 / GiB, 3),
            "tokens": [json.loads(line)["tokens"] for line in done.stdout.splitlines() if line.startswith("{")]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--prompts", type=int, default=2, help="copies of the prompt, one batch each")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = []
    for r in range(args.rounds):
        for variant in ("tree", "pattern") if r % 2 == 0 else ("pattern", "tree"):
            runs.append(run(variant, args.export, args.prompts, args.steps, args.gen_length, args.threads))
            print(f"round {r + 1} {variant}: {runs[-1]['peak_rss_gib']} GiB, {runs[-1]['seconds']} s", flush=True)
    tokens = {json.dumps(r["tokens"]) for r in runs}
    summary = {v: {"peak_rss_gib": statistics.median(r["peak_rss_gib"] for r in runs if r["variant"] == v),
                   "seconds": statistics.median(r["seconds"] for r in runs if r["variant"] == v)}
               for v in ("tree", "pattern")}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO,
                            check=False).stdout.strip()
    record = {"command": " ".join([os.path.relpath(sys.executable, REPO), *sys.argv]), "commit": commit,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "export": str(args.export),
              "prompts": args.prompts, "batch_size": 1, "steps": args.steps, "gen_length": args.gen_length,
              "threads": args.threads, "same_tokens": len(tokens) == 1, "medians": summary,
              "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary))
    if len(tokens) != 1:
        raise SystemExit(f"the runs answered with {len(tokens)} different token sequences: {args.out} records them")


if __name__ == "__main__":
    main()
