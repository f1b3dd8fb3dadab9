"""Where an export's first step goes (issue 48): in one fresh process, the seconds to import the runtime, open the
target (manifest, Seer config, tokenizer), open every graph's ONNX Runtime session (three in a --kv-cache export),
and the step-zero calls of a prompt of --prompt ids and --gen-length masks, alternating a call that scores every mask (what step zero does) with
one that scores a single column (the body alone, near enough), --calls times each. Then --spawned times, what a
user sees: `seer-deploy generate` in a fresh process (through llama_cpp/_seer_child.py, which times every ONNX Runtime
call, as compare.py does), the seconds from spawning it to the end of its first graph call; alternating with it, the
same first call in a bare process (`python -c`: numpy and onnxruntime imported, one InferenceSession of step.onnx
with the same threads and prepacking, one step zero over the same shape, no seer-deploy code), the floor of any
runtime made of Python and ONNX Runtime on this machine, with its marks (imports done, session open, call done).
Writes JSON with the command, commit and date.

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
    spawned, bare = [], []
    for _ in range(args.spawned):
        spawned.append(spawn_to_first_step(args.export, args.gen_length, args.threads))
        bare.append(spawn_bare(args.export, args.prompt, args.gen_length, args.threads, info.mask_id))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    record = {"command": "python benchmarks/first_step.py " + " ".join(sys.argv[1:]), "commit": commit,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "export": str(args.export), "prompt_ids": P, "gen_length": G, "threads": args.threads,
              **{k: round(v, 4) for k, v in marks.items()}, **calls,
              "generate_first_step_done_s": spawned, "bare_python_onnxruntime": bare}
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


# numpy and onnxruntime only: one session of the step graph as the backend opens it on the CPU (threads, parallel
# prepacking, errors-only log), one step zero over a prompt and every response slot a candidate; prints the wall-clock
# time of each mark.
BARE = """
import sys, time, json
import numpy as np, onnxruntime as ort
marks = {"imports": time.time()}
graph, threads, P, G, mask = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.add_session_config_entry(sys.argv[6], "1")  # the backend's parallel prepacking (ort_sessions.PARALLEL_PREPACK)
so.log_severity_level = 3
session = ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"])
marks["session"] = time.time()
S = P + G
ids = np.full((1, S), mask, dtype=np.int64)
ids[0, :P] = np.arange(100, 100 + P)
feed = {"input_ids": ids, "attention_mask": np.ones((1, S), np.int64), "temperature": np.zeros(1, np.float32),
        "sample_uniform": np.full((1, S), 0.5, np.float32), "candidates": np.arange(P, S, dtype=np.int64)[None],
        "with_stats": np.ones(1, np.int64), "score_rule": np.zeros(1, np.int64),
        "score_temperature": np.ones(1, np.float32)}
session.run(["token_ids", "confidence"], feed)
marks["first_call"] = time.time()
print(json.dumps(marks))
"""


def spawn_bare(export: Path, prompt: int, gen_length: int, threads: int, mask_id: int) -> dict[str, float]:
    """Seconds from spawning the bare process (BARE) to each of its marks."""
    from seer_deploy.engines.ort_sessions import PARALLEL_PREPACK

    start = time.time()
    done = subprocess.run([sys.executable, "-c", BARE, str(export / "step.onnx"), str(threads), str(prompt),
                           str(gen_length), str(mask_id), PARALLEL_PREPACK], check=True, capture_output=True,
                          text=True)
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: round(t - start, 3) for name, t in marks.items()}


if __name__ == "__main__":
    main()
