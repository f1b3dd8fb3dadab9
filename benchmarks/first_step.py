"""Where an export's first step goes (issue 48): in one fresh process, the seconds to import the runtime, open the
target (manifest, Seer config, tokenizer), open every graph's ONNX Runtime session (three in a --kv-cache export),
and the step-zero calls of a prompt of --prompt ids and --gen-length masks, alternating a call that scores every mask (what step zero does) with
one that scores a single column (the body alone, near enough), --calls times each. Then --spawned times, what a
user sees: `seer-deploy generate` in a fresh process (through llama_cpp/_seer_child.py, which times every ONNX Runtime
call, as compare.py does), the seconds from spawning it to the end of its first graph call. Writes JSON with the
command, commit and date.

    python benchmarks/first_step.py EXPORT_DIR [--prompt 32] [--gen-length 256] [--calls 3] [--spawned 3] [--threads 2]
        --out F.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--spawned", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    marks = {}
    t = time.perf_counter()
    import numpy as np

    from seer_deploy.core.backend import StepInput
    from seer_deploy.runtime.openers import open_target
    from seer_deploy.runtime.targets import TargetOptions
    marks["imports_s"] = time.perf_counter() - t
    t = time.perf_counter()
    backend, info = open_target(str(args.export), TargetOptions(threads=args.threads))
    marks["open_target_s"] = time.perf_counter() - t
    t = time.perf_counter()
    backend.open_sessions()  # type: ignore[attr-defined]
    marks["sessions_s"] = time.perf_counter() - t
    P, G = args.prompt, args.gen_length
    ids = np.concatenate([np.arange(100, 100 + P), np.full(G, info.mask_id)])[None]
    every = np.arange(P, P + G)[None]
    calls: dict[str, list[float]] = {"every_mask_s": [], "one_column_s": []}
    for _ in range(args.calls):
        for name, candidates in (("every_mask_s", every), ("one_column_s", every[:, :1])):
            t = time.perf_counter()
            backend.step0(StepInput(ids, candidates=candidates))
            calls[name].append(round(time.perf_counter() - t, 4))
    spawned = [spawn_to_first_step(args.export, args.gen_length, args.threads) for _ in range(args.spawned)]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    record = {"command": "python benchmarks/first_step.py " + " ".join(sys.argv[1:]), "commit": commit,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "export": str(args.export), "prompt_ids": P, "gen_length": G, "threads": args.threads,
              **{k: round(v, 4) for k, v in marks.items()}, **calls,
              "generate_first_step_done_s": spawned}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


PROMPT = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing"  # compare.py's


def spawn_to_first_step(export: Path, gen_length: int, threads: int) -> float:
    """Seconds from spawning `seer-deploy generate` (two steps, Seer off, compare.py's prompt) to the end of its
    first ONNX Runtime call."""
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        start = time.time()
        subprocess.run([sys.executable, str(here / "llama_cpp" / "_seer_child.py"), str(trace), "generate",
                        str(export), "--prompt", PROMPT, "--gen-length", str(gen_length), "--block-length",
                        str(gen_length), "--steps", "2", "--threads", str(threads), "--no-seer", "--json"],
                       check=True, capture_output=True, cwd=here.parent)
        first_call = json.loads(trace.read_text())["calls"][0]
    return round(first_call[1] - start, 3)


if __name__ == "__main__":
    main()
