"""`seer-deploy generate TARGET`: parse the prompts and options, call the generation service, print the answers.

How a request runs (any target kind, text or pictures) is the service's decision (`seer_deploy.service`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from seer_deploy.cli.options import generation_options, seed_option, seer_options, target_options, template_options
from seer_deploy.cli.verbs import summary
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.prompts.prompt import assign_images, image_name, read_prompts_file
from seer_deploy.service import Prompt, Run, SeerOptions, Service, ServiceOptions, TargetOptions, TemplateChoice


def read_requests(prompt: tuple[str, ...], images: tuple[str, ...], prompts_file: Path | None) -> list[Prompt]:
    """Requests from --prompt (repeatable, its --image files handed to the `<image>` placeholders in order) and
    --prompts FILE.jsonl ({"prompt": ..., "image": ...} per line, or plain lines)."""
    requests = assign_images(prompt, images) if prompt or images else []
    if prompts_file is not None:
        requests += read_prompts_file(prompts_file)
    if not requests:
        raise ConfigError("no prompt given; pass --prompt TEXT or --prompts FILE.jsonl")
    return requests


def decode_record(generation: GenerationConfig) -> dict[str, object]:
    """How the steps were decoded, as --json reports it: the rule and its setting, and the KV cache."""
    record: dict[str, object] = {"rule": generation.decode, "kv_cache": generation.kv_cache,
                                 "prompt_cache": generation.prompt_cache}
    if generation.dream_sampler:
        record.update(remasking=generation.remasking, steps=generation.steps, eps=generation.eps,
                      alg_temp=generation.alg_temp, top_p=generation.top_p, top_k=generation.top_k)
        if generation.decode == "confident":
            record["threshold"] = generation.threshold
    elif generation.decode == "threshold":
        record["threshold"] = generation.threshold
    elif generation.decode == "factor":
        record["factor"] = generation.factor
    else:
        record["steps"] = generation.steps
    if generation.block_length is not None:
        record["block_length"] = generation.block_length
    return record


def time_to_first_step(run: Run) -> dict[str, float]:
    """The run's start-up cost as --json reports it (the same on every line of a run): load_s, seconds to open the
    target; first_step_s, seconds from opening it to the end of the first batch's step zero (load_s included)."""
    return {"load_s": round(run.load_seconds, 6), "first_step_s": round(run.first_step_seconds, 6)}


def print_run(run: Run, gen_length: int, as_json: bool) -> None:
    """One line (or JSON object) per answer on stdout, then a summary line on stderr."""
    for answer in run.answers:
        request = answer.request
        if as_json:
            record: dict[str, object] = {"prompt": request.prompt, "answer": answer.text, "tokens": answer.tokens,
                                         "passes": answer.passes, **time_to_first_step(run)}
            if run.generation is not None:
                record["decode"] = decode_record(run.generation)
            if request.images:
                record["images"] = [str(p) for p in request.images]
            if answer.seer is not None:
                record["seer"] = dataclasses.asdict(answer.seer)
            click.echo(json.dumps(record))
        elif request.images:
            click.echo(f"{request.prompt} [{', '.join(image_name(p) for p in request.images)}] -> {answer.text}")
        else:
            click.echo(f"{request.prompt} -> {answer.text}")
    summary = f"{len(run.answers)} prompts on {run.backend}: {run.seconds:.2f}s, {run.passes} forward passes"
    reports = [r for r in run.reports if r is not None]
    if reports:
        kept = sum(r.kept for r in reports) / len(reports)
        full = sum(r.full_tokens_processed for r in reports)
        summary += (f"; seer ({reports[0].detector or 'forced'}): mean kept {kept:.1f} of {gen_length} slots, "
                    f"{run.tokens_processed} tokens processed ({run.tokens_processed / full:.2f}x full length)")
    else:
        summary += f", {run.tokens_processed} tokens processed"
    summary += f"; first step after {run.first_step_seconds:.2f}s (target opened in {run.load_seconds:.2f}s)"
    click.echo(summary, err=True)


@click.command("generate", short_help=summary("generate"))
@click.argument("target")
@click.option("--prompt", "-p", multiple=True, help="A prompt (repeat for a batch).")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of prompts: JSON lines with a 'prompt' field (and for pictures an 'image' field: a path, or "
                   "a list with one per <image>, relative to the file), or one prompt per line.")
@generation_options()
@seed_option()
@click.option("--batch-size", type=int, default=8, show_default=True,
              help="Prompts run together (TensorRT: at most the engine's max batch).")
@seer_options()
@target_options()
@click.option("--image", "images", multiple=True, help="An image for the prompts' <image> placeholders, in order "
              "(repeat); TARGET is then a multimodal checkpoint, 'demo-vl', or an export or engine made from one.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per prompt (with Seer: boundary, kept length, passes, tokens processed vs full), "
                   "with the run's time to first step on each: load_s (seconds to open the target) and first_step_s "
                   "(seconds from opening it to the end of the first batch's step zero, load_s included).")
@template_options()
def command(target: str, prompt: tuple[str, ...], prompts_file: Path | None, generation: GenerationConfig, seed: int,
            batch_size: int, seer: SeerOptions, target_options: TargetOptions, images: tuple[str, ...],
            as_json: bool, template: TemplateChoice | None) -> None:
    """Generate answers for prompts with TARGET: a checkpoint directory, 'demo' or 'demo-vl' (torch), an export
    directory (ONNX Runtime) or an engine directory (ONNX Runtime or TensorRT); with --image, about pictures."""
    requests = read_requests(prompt, images, prompts_file)
    options = ServiceOptions(generation=generation, target=target_options, seer=seer, template=template,
                             batch_size=batch_size, seed=seed)
    service = Service(target, options, warn=lambda message: click.echo(message, err=True))
    show = not as_json and len(requests) > service.batch_size
    with click.progressbar(length=len(requests), label=f"generating ({service.backend.name})", file=sys.stderr,
                           hidden=not show) as bar:
        run = service.generate(requests, progress=bar.update)
    print_run(run, generation.gen_length, as_json)
