"""Does a float16 export answer as the float32 one does? Exports the demo in both dtypes (each checks itself against
torch), then answers the held-out prompts with each on ONNX Runtime, Seer on (the shipped config) and off, and
counts identical answers and exact matches.

    python scripts/fp16_parity.py --prompts 500 --gen-length 64 --out benchmarks/results/fp16_parity.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.service import SeerOptions, Service, ServiceOptions, TargetOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = ap.parse_args()
    examples = heldout_examples(args.prompts)
    requests = [Prompt(e.prompt) for e in examples]
    generation = GenerationConfig(args.gen_length, args.gen_length, block_length=args.gen_length)
    figures: dict[str, object] = {"prompts": len(requests), "gen_length": args.gen_length}
    with tempfile.TemporaryDirectory() as tmp:
        answers: dict[tuple[str, bool], list[str]] = {}
        for dtype in ("fp32", "fp16"):
            result = export_checkpoint("demo", Path(tmp) / dtype, ExportOptions(dtype=dtype))
            figures[f"{dtype} export check"] = {k: round(v, 6) for k, v in result.max_diff.items()}
            for seer in (False, True):
                options = ServiceOptions(generation=generation, batch_size=25,
                                         target=TargetOptions(threads=args.threads), seer=SeerOptions(on=seer))
                started = time.perf_counter()
                run = Service(result.out, options).generate(requests)
                answers[dtype, seer] = [a.text for a in run.answers]
                figures[f"{dtype} seer={seer} seconds"] = round(time.perf_counter() - started, 1)
    for seer in (False, True):
        same = sum(a == b for a, b in zip(answers["fp32", seer], answers["fp16", seer], strict=True))
        figures[f"identical answers, seer={seer}"] = f"{same} of {len(requests)}"
        for dtype in ("fp32", "fp16"):
            hits = sum(a.strip() == e.answer for a, e in zip(answers[dtype, seer], examples, strict=True))
            figures[f"exact match {dtype} seer={seer}"] = round(hits / len(requests), 4)
    print(json.dumps(figures, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
