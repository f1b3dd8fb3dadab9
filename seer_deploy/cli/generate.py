"""`seer-deploy generate TARGET`: answer prompts with a checkpoint (torch), an export directory (ONNX Runtime) or an
engine directory (ONNX Runtime or TensorRT); Seer truncates each answer, the batch scheduler runs the kept rows.

Prompts run in batches of --batch-size: one step zero per batch, then every row on its own kept length (see
`seer_deploy.runtime.scheduler`). Images (--image) or a multimodal TARGET take the multimodal path (`cli.vl`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import torch

from seer_deploy.cli.options import generation_config, generation_options
from seer_deploy.core.backend import Backend
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.runtime.targets import BACKEND_CHOICES, BackendChoice, TargetInfo, TargetOptions, calibrated_seer
from seer_deploy.seer.config import SeerConfig, TailContext, parse_tail_context
from seer_deploy.seer.plan import SeerReport


def read_prompts(prompt: tuple[str, ...], prompts_file: Path | None) -> list[str]:
    """Prompts from --prompt (repeatable) and --prompts FILE.jsonl ({"prompt": ...} per line, or plain lines)."""
    texts = list(prompt)
    if prompts_file is not None:
        for n, line in enumerate(prompts_file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    texts.append(str(json.loads(line)["prompt"]))
                except (json.JSONDecodeError, KeyError) as exc:
                    raise ConfigError(f"{prompts_file}:{n}: expected {{\"prompt\": \"...\"}} ({exc})") from exc
            else:
                texts.append(line)
    if not texts:
        raise ConfigError("no prompt given; pass --prompt TEXT or --prompts FILE.jsonl")
    return texts


@dataclass
class BatchRun:
    """Answers of a prompt set through one backend, and what they cost."""

    tokens: list[list[int]]  # response ids per prompt (the cut tails hold EOS)
    reports: list[SeerReport | None]  # per prompt, when Seer ran
    steps_run: int  # forward passes, over all batches
    tokens_processed: int  # real tokens through the model, over all batches
    seconds: float


def run_batches(
    backend: Backend,
    info: TargetInfo,
    prompts: Sequence[list[int]],
    config: GenerationConfig,
    *,
    seer: SeerConfig | None,
    batch_size: int,
    seed: int = 0,
    progress: Callable[[int], None] = lambda done: None,
) -> BatchRun:
    """Run `prompts` in batches of `batch_size` through the runtime loop (Seer and hybrid batching when `seer`)."""
    from seer_deploy.runtime.loop import run_generation

    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    run = BatchRun([], [], 0, 0, 0.0)
    start = time.perf_counter()
    for n, lo in enumerate(range(0, len(prompts), batch_size)):
        chunk = list(prompts[lo : lo + batch_size])
        out = run_generation(backend, chunk, config, mask_id=info.mask_id, pad_id=info.pad_id, eos_id=info.eos_id,
                             seed=seed + n, seer=seer)
        run.tokens.extend(row.tolist() for row in out.tokens)
        run.reports.extend(out.seer if out.seer else [None] * len(chunk))
        run.steps_run += out.steps_run
        run.tokens_processed += out.tokens_processed
        progress(len(chunk))
    run.seconds = time.perf_counter() - start
    return run


@click.command("generate")
@click.argument("target")
@click.option("--prompt", "-p", multiple=True, help="A prompt (repeat for a batch).")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of prompts: JSON lines with a 'prompt' field, or one prompt per line.")
@generation_options
@click.option("--backend", "backend_name", type=click.Choice(BACKEND_CHOICES), default=None,
              help="torch, ort or tensorrt [default: the target's own: checkpoint torch, export directory ort, "
                   "engine directory what it was built for].")
@click.option("--batch-size", type=int, default=8, show_default=True,
              help="Prompts run together (TensorRT: at most the engine's max batch).")
@click.option("--seer/--no-seer", "use_seer", default=None,
              help="Truncate each response after step zero [default: on when a calibrated Seer config is found].")
@click.option("--seer-config", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Seer config from `seer-deploy calibrate` [default: the target's own, if any].")
@click.option("--tail-context", default=None, metavar="N|all",
              help="Seer: cut slots the later steps still run, as committed EOS. 0 is the paper's cut (fastest); "
                   "'all' keeps the whole cut tail in view (every step at full length, the steps still the cut's; "
                   "on the demo the answers then equal full length's) [default: the Seer config's].")
@click.option("--provider", "providers", multiple=True,
              help="ONNX Runtime provider, in order of preference (repeat) [default: the engine's, else CUDA if "
                   "available, else CPU].")
@click.option("--threads", type=int, default=None, help="ONNX Runtime intra-op threads [default: the engine's, "
              "else ONNX Runtime's].")
@click.option("--image", "images", multiple=True, help="An image for the prompts' <image> placeholders (repeat); "
              "TARGET is then a multimodal checkpoint, 'demo-vl' or a multimodal export.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per prompt (with Seer: boundary, kept length, steps, tokens processed vs full).")
def command(target: str, prompt: tuple[str, ...], prompts_file: Path | None, gen_length: int, steps: int | None,
            block_length: int | None, temperature: float, remasking: str, cfg_scale: float, seed: int,
            backend_name: BackendChoice | None, batch_size: int, use_seer: bool | None, seer_config: Path | None,
            tail_context: str | None, providers: tuple[str, ...], threads: int | None, images: tuple[str, ...],
            as_json: bool) -> None:
    """Generate answers for prompts with TARGET: a checkpoint directory or 'demo' (torch), an export directory
    (ONNX Runtime) or an engine directory (ONNX Runtime or TensorRT)."""
    from seer_deploy.cli import vl
    from seer_deploy.runtime.targets import open_target, target_kind

    texts = read_prompts(prompt, prompts_file)
    config = generation_config(gen_length, steps, block_length, temperature, remasking, cfg_scale)
    config.validate()
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    context = None if tail_context is None else parse_tail_context(tail_context)
    if vl.wants_vl(target, images):
        seer_vl = with_tail_context(vl.resolve_seer_vl(target, use_seer, seer_config,
                                                       warn=lambda m: click.echo(m, err=True)), context)
        vl.echo_generate_vl(target, texts, images, config, seer=seer_vl, seed=seed, as_json=as_json, say=click.echo)
        return
    seer = with_tail_context(resolve_seer(target, use_seer, seer_config), context)
    if cfg_scale > 0 and backend_name in (None, "torch") and target_kind(target) == "checkpoint":
        run, info, name = _reference(target, texts, config, seer, seed)
    else:
        backend, info = open_target(target, backend_name, TargetOptions(providers=providers or None, threads=threads,
                                                                        seer=seer))
        seer = info.fit_seer(seer)
        tok = info.tokenizer()
        ids = [tok.encode_prompt(t) for t in texts]
        size = min(batch_size, info.max_batch) if info.max_batch else batch_size
        show = not as_json and len(ids) > size
        with click.progressbar(length=len(ids), label=f"generating ({backend.name})", file=sys.stderr,
                               hidden=not show) as bar:
            run = run_batches(backend, info, ids, config, seer=seer, batch_size=size, seed=seed,
                              progress=lambda n: bar.update(n))
        name = backend.name
    tok = info.tokenizer()
    for text, row, report in zip(texts, run.tokens, run.reports, strict=True):
        answer = tok.decode_answer(row)
        if as_json:
            record: dict[str, object] = {"prompt": text, "answer": answer, "tokens": row}
            if report is not None:
                record["seer"] = dataclasses.asdict(report)
            click.echo(json.dumps(record))
        else:
            click.echo(f"{text} -> {answer}")
    summary = f"{len(texts)} prompts on {name}: {run.seconds:.2f}s, {run.steps_run} forward passes"
    reports = [r for r in run.reports if r is not None]
    if reports:
        kept = sum(r.kept for r in reports) / len(reports)
        full = sum(r.full_tokens_processed for r in reports)
        summary += (f"; seer ({reports[0].detector or 'forced'}): mean kept {kept:.1f} of {gen_length} slots, "
                    f"{run.tokens_processed} tokens processed ({run.tokens_processed / full:.2f}x full length)")
    else:
        summary += f", {run.tokens_processed} tokens processed"
    click.echo(summary, err=True)


def _reference(target: str, texts: list[str], config: GenerationConfig, seer: SeerConfig | None, seed: int
               ) -> tuple[BatchRun, TargetInfo, str]:
    """Classifier-free guidance needs full logits: the torch reference loop on the checkpoint, as one batch."""
    from seer_deploy.runtime.reference import generate
    from seer_deploy.runtime.targets import open_target
    from seer_deploy.runtime.torch_backend import TorchBackend

    backend, info = open_target(target, "torch")
    assert isinstance(backend, TorchBackend)  # a checkpoint opens as torch
    model = backend.model
    tok = info.tokenizer()
    start = time.perf_counter()
    result = generate(model, [tok.encode_prompt(t) for t in texts], config,
                      generator=torch.Generator().manual_seed(seed), seer=seer)
    reports: list[SeerReport | None] = list(result.seer) if result.seer else [None] * len(texts)
    run = BatchRun([row.tolist() for row in result.tokens], reports, result.steps_run, result.tokens_processed,
                   time.perf_counter() - start)
    return run, info, "torch (reference loop)"


def with_tail_context(seer: SeerConfig | None, context: TailContext | None) -> SeerConfig | None:
    """The config with --tail-context applied; the option needs Seer on."""
    if context is None:
        return seer
    if seer is None:
        raise ConfigError("--tail-context applies to Seer runs; drop --no-seer or give a --seer-config")
    return seer.with_(tail_context=context)


def resolve_seer(target: str, use_seer: bool | None, seer_config: Path | None) -> SeerConfig | None:
    """The Seer config to run with: --seer-config, else the target's calibrated one; None = no truncation."""
    if use_seer is False:
        return None
    if seer_config is not None:
        return SeerConfig.load(seer_config)
    found = calibrated_seer(target)
    if found is None and use_seer:
        click.echo("warning: no calibrated Seer config for this target; using the built-in defaults "
                   "(run `seer-deploy calibrate` for a safe margin)", err=True)
        return SeerConfig()
    return found
