"""`seer-deploy generate TARGET`: parse the prompts and options, call the generation service, print the answers.

How a request runs (any target kind, text or pictures) is the service's decision (`seer_deploy.service`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from seer_deploy.cli.options import decoding_options, generation_config, generation_options, template_options
from seer_deploy.cli.verbs import summary
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.prompts.prompt import assign_images, image_name, read_prompts_file
from seer_deploy.runtime.targets import BACKEND_CHOICES, BackendChoice
from seer_deploy.seer.config import parse_tail_context
from seer_deploy.service import Prompt, Run, Service, ServiceOptions


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
    record: dict[str, object] = {"rule": generation.decode, "kv_cache": generation.kv_cache}
    if generation.decode == "threshold":
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
@generation_options
@decoding_options
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
@click.option("--first-canvas", type=int, default=None, metavar="N",
              help="Seer: progressive step zero. Run step zero on N response slots first; rows whose end lies inside "
                   "are planned from it, the others run step zero at full --gen-length (0: off) [default: the Seer "
                   "config's].")
@click.option("--provider", "providers", multiple=True,
              help="ONNX Runtime provider, in order of preference (repeat) [default: the engine's, else CUDA if "
                   "available, else CPU]. Export and ONNX Runtime engine targets only.")
@click.option("--threads", type=int, default=None, help="Intra-op threads: ONNX Runtime's session, or torch's for a "
              "checkpoint [default: the engine's, else the library's]. Not for TensorRT engines.")
@click.option("--device", default=None, metavar="cpu|cuda[:N]",
              help="Where the model runs: torch's device for a checkpoint, the CUDA provider's GPU for ONNX Runtime, "
                   "the GPU of a TensorRT engine [default: torch cpu; ONNX Runtime CUDA if installed; TensorRT GPU 0].")
@click.option("--io-binding", is_flag=True,
              help="ONNX Runtime: bind inputs and outputs to buffers kept on the device per call shape; only the "
                   "chosen tokens and their confidence come back to the host. Pays off on CUDA.")
@click.option("--cuda-graph", is_flag=True,
              help="ONNX Runtime on CUDA or TensorRT: capture the step graph once per call shape as a CUDA graph and "
                   "replay it (calls padded to fixed shapes: batch to a power of two, sequence to a multiple of 32).")
@click.option("--image", "images", multiple=True, help="An image for the prompts' <image> placeholders, in order "
              "(repeat); TARGET is then a multimodal checkpoint, 'demo-vl', or an export or engine made from one.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per prompt (with Seer: boundary, kept length, passes, tokens processed vs full), "
                   "with the run's time to first step on each: load_s (seconds to open the target) and first_step_s "
                   "(seconds from opening it to the end of the first batch's step zero, load_s included).")
@template_options
def command(target: str, prompt: tuple[str, ...], prompts_file: Path | None, gen_length: int, steps: int | None,
            block_length: int | None, temperature: float, remasking: str, cfg_scale: float, seed: int,
            decode: str, threshold: float, factor: float, kv_cache: bool, backend_name: BackendChoice | None,
            batch_size: int, use_seer: bool | None, seer_config: Path | None,
            tail_context: str | None, first_canvas: int | None, providers: tuple[str, ...], threads: int | None,
            device: str | None, io_binding: bool, cuda_graph: bool, images: tuple[str, ...], as_json: bool,
            chat_template: Path | None, raw_prompts: bool) -> None:
    """Generate answers for prompts with TARGET: a checkpoint directory, 'demo' or 'demo-vl' (torch), an export
    directory (ONNX Runtime) or an engine directory (ONNX Runtime or TensorRT); with --image, about pictures."""
    requests = read_requests(prompt, images, prompts_file)
    options = ServiceOptions(
        generation=generation_config(gen_length, steps, block_length, temperature, remasking, cfg_scale,
                                     decode=decode, threshold=threshold, factor=factor, kv_cache=kv_cache),
        backend=backend_name, batch_size=batch_size, providers=providers or None, threads=threads, device=device,
        io_binding=io_binding, cuda_graph=cuda_graph, seer=use_seer,
        seer_config=seer_config, tail_context=None if tail_context is None else parse_tail_context(tail_context),
        first_canvas=first_canvas,
        seed=seed, chat_template=chat_template, raw_prompts=raw_prompts,
    )
    service = Service(target, options, warn=lambda message: click.echo(message, err=True))
    show = not as_json and len(requests) > service.batch_size
    with click.progressbar(length=len(requests), label=f"generating ({service.backend.name})", file=sys.stderr,
                           hidden=not show) as bar:
        run = service.generate(requests, progress=bar.update)
    print_run(run, gen_length, as_json)
