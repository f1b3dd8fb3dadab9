"""The prompt cache, per family and rule: full length, Seer, and Seer with the prompt cache (`--prompt-cache`) under
each family's own decoding rule, on

- the trained multimodal demo (LLaDA-V's architecture, LLaDA's loop: the cache is Dimple's prefilling there, an
  approximation);
- the same weights with LaViDa's prefix-DLM attention switched on in config.json (the cache is exact there; the
  weights were not trained for that attention, so its answers are not the demo's: what it shows is identical tokens
  and the cost), under LaViDa-LLaDA's loop and LaViDa-Dream's rule;
- a Dimple-layout checkpoint with pictures (tests/dimple_checkpoint.py: Dimple's public names, M-RoPE, shifted
  logits; random weights, so Seer's cut and the answers mean nothing: what it shows is the prefilling's cost and
  whether its tokens stay the rule's at full length), under Dimple's two rules;
- the trained text demo under Dream's rule (Dimple-style prefilling on a text prompt).

Per mode: forward passes, real tokens processed, the share of them spent on prompt positions (each pass's prompt
columns over its columns, summed over the passes: pictures make the prompt most of a pass), seconds (median of
--rounds, the modes alternating inside each round), answers identical to the rule at full length and to Seer without
the cache, exact match against the task's answer. ONNX Runtime on the CPU, exports made with --kv-cache. Writes the
raw figures (with the commit and date) to --out/prompt_cache.json and a markdown table to --out/prompt_cache.md.

    python benchmarks/bench_prompt_cache.py [--prompts 48] [--batch 8] [--rounds 3] [--threads 2] \
        [--out benchmarks/results-prompt-cache]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from seer_deploy.bench.rows import RULES
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.export.dimple import export_with_pictures
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.multimodal_files import checkpoint_directory
from seer_deploy.models.demos import demo_tasks, demo_vl_tasks
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.runtime.targets import TargetOptions
from seer_deploy.seer.options import SeerOptions
from seer_deploy.service import Run, Service, ServiceOptions

MODES = {  # name -> (Seer on, the prompt cache on)
    "full": (False, False),
    "seer": (True, False),
    "seer+prompt-cache": (True, True),
}


LLADA = "llada"  # LLaDA's blockwise low-confidence loop (the bench's default decoding)


@dataclass
class Row:
    target: str
    rule: str  # LLADA or a bench.rows.RULES name
    mode: str
    passes: int
    tokens: int
    prompt_share: float  # prompt positions over all positions of the passes
    later_prompt_share: float  # the same over the passes after step zero (what the cache changes)
    seconds: list[float]
    identical_to_full: float  # answers equal to the same rule's at full length
    identical_to_seer: float
    exact_match: float


def prompt_tokens(run: Run, counts: list[int], cached: bool) -> tuple[int, int]:
    """Real prompt positions the run's passes processed, in all passes and in those after step zero: every pass runs
    the whole prompt, or with the prompt cache step zero does and each later pass its last token only."""
    later = sum((a.passes - 1) * (1 if cached else n) for a, n in zip(run.answers, counts, strict=True))
    return sum(counts) + later, later


def measure(target: Path, name: str, rule: str, requests: list[Prompt], answers: list[str],
            config: GenerationConfig, args: argparse.Namespace) -> list[Row]:
    """The three modes under `rule` on one export."""
    config = config if rule == LLADA else replace(config, **RULES[rule])  # type: ignore[arg-type]
    services = {mode: Service(target, ServiceOptions(generation=replace(config, prompt_cache=cached),
                                                     seer=SeerOptions(on=seer), batch_size=args.batch,
                                                     target=TargetOptions(threads=args.threads)))
                for mode, (seer, cached) in MODES.items()}
    counts = list(services["full"].prepare(requests).prompt_tokens)
    full_positions = [n + config.gen_length for n in counts]  # step zero's, per request
    for service in services.values():  # warm up: every session opened, every graph run once
        service.generate(requests[:args.batch])
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, service in services.items():
            runs[mode].append(service.generate(requests))
    first = {mode: r[0] for mode, r in runs.items()}
    rows = []
    for mode, (_, cached) in MODES.items():
        run = first[mode]
        prompt, later = prompt_tokens(run, counts, cached)
        rows.append(Row(
            name, rule, mode, run.passes, run.tokens_processed, prompt / run.tokens_processed,
            later / max(1, run.tokens_processed - sum(full_positions)),
            [r.seconds for r in runs[mode]],
            _same(run, first["full"]), _same(run, first["seer"]),
            sum(a.text.strip() == want for a, want in zip(run.answers, answers, strict=True)) / len(answers),
        ))
        print(f"{name} | {rule} | {mode}: {rows[-1].passes} passes, {rows[-1].tokens} tokens, "
              f"{statistics.median(rows[-1].seconds):.2f} s", file=sys.stderr, flush=True)
    return rows


def _same(a: Run, b: Run) -> float:
    return sum(x.tokens == y.tokens for x, y in zip(a.answers, b.answers, strict=True)) / len(a.answers)


def prefix_dlm_copy(checkpoint: Path, dest: Path) -> Path:
    """The checkpoint with LaViDa's prefix-DLM attention asked for in its config.json (`prefix_lm`)."""
    shutil.copytree(checkpoint, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "prefix_lm": True}))
    return dest


def dimple_checkpoint(root: Path) -> Path:
    """The tests' Dimple-layout checkpoint (public names, random weights)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from dimple_checkpoint import write_dimple

    return write_dimple(root)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results-prompt-cache"))
    args = parser.parse_args()
    examples = demo_vl_tasks.heldout_examples(args.prompts)
    pictured = ([Prompt(e.prompt, (e.image(),)) for e in examples], [e.answer for e in examples])
    texts = demo_tasks.heldout_examples(args.prompts)
    text = ([Prompt(e.prompt) for e in texts], [e.answer for e in texts])
    config = GenerationConfig(args.gen_length, args.gen_length)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        demo = checkpoint_directory("demo-vl")
        targets = [  # name, checkpoint, the rules it runs, prompts
            ("demo-vl (LLaDA-V; prompt cache = Dimple's prefilling)", demo, (LLADA,), pictured),
            ("demo-vl weights, prefix-DLM (LaViDa's attention; prompt cache exact)",
             prefix_dlm_copy(demo, Path(tmp) / "prefix"), (LLADA, "lavida-dream"), pictured),
            ("Dimple layout, random weights (M-RoPE, shifted logits; prefilling)", dimple_checkpoint(Path(tmp)),
             ("dimple", "dimple-confident"), pictured),
            ("demo (text; Dream's rule; prompt cache = Dimple's prefilling)", checkpoint_directory("demo"),
             ("dream",), text),
        ]
        for index, (name, checkpoint, rules, (requests, answers)) in enumerate(targets):
            out = Path(tmp) / f"export{index}"
            options = ExportOptions(kv_cache=True, verify=False)
            export = (export_with_pictures if requests[0].images else export_checkpoint)(checkpoint, out, options).out
            for rule in rules:
                rows += measure(export, name, rule, requests, answers, config, args)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    record = {"command": "python benchmarks/bench_prompt_cache.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
              "commit": commit, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "backend": "onnxruntime-cpu", "prompts": args.prompts, "gen_length": args.gen_length,
              "rows": [vars(r) for r in rows]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prompt_cache.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [("| target | rule | mode | passes | tokens processed | prompt share: all passes | prompt share: after "
              "step zero | seconds (median) | identical to the rule at full length | identical to Seer | exact "
              "match |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.target} | {r.rule} | {r.mode} | {r.passes} | {r.tokens} | {r.prompt_share:.1%} | "
                     f"{r.later_prompt_share:.1%} | "
                     f"{statistics.median(r.seconds):.2f} | {r.identical_to_full:.0%} | {r.identical_to_seer:.0%} | "
                     f"{r.exact_match:.0%} |")
    (args.out / "prompt_cache.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
