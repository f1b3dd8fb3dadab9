"""`seer-deploy build`: an export dir -> an engine dir for ONNX Runtime or TensorRT."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from seer_deploy.cli.options import target_options
from seer_deploy.cli.verbs import summary
from seer_deploy.core.checks import ascii_int, int_in, number_in
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.files import read_json

if TYPE_CHECKING:
    from seer_deploy.runtime.targets import TargetOptions

MAX_KEPT_LENGTH = 1 << 30


def read_kept_lengths(path: Path) -> dict[int, float] | list[int]:
    """A calibration histogram: a JSON list of kept lengths, or a {"length": count} object."""
    data = read_json(path, "--kept-lengths", expect=object)
    fix = "give a list of lengths or a {length: count} object"
    if isinstance(data, list) and all(int_in(v, 1, MAX_KEPT_LENGTH) for v in data):
        return list(data)
    lengths = {k: ascii_int(k) for k in data} if isinstance(data, dict) else {}
    if isinstance(data, dict) and all(int_in(lengths[k], 1, MAX_KEPT_LENGTH) and number_in(v, 0, math.inf)
                                      for k, v in data.items()):
        return {lengths[k]: float(v) for k, v in data.items()}  # type: ignore[misc]  # int_in: not None
    raise ConfigError(f"--kept-lengths {path}: lengths must be positive integers and counts numbers >= 0; {fix}")


@click.command("build", short_help=summary("build"))
@click.argument("export_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="The engine directory to write.")
@target_options("backend", "providers", "threads", backend={
    "type": click.Choice(["ort", "tensorrt"]), "default": "ort", "show_default": True,
    "help": "What the engine dir runs on: ONNX Runtime (its session settings recorded) or TensorRT (engines built)."},
    providers={"help": "ONNX Runtime provider, in order of preference (repeat) [default: CUDA if available, else "
                       "CPU]."},
    threads={"default": 0, "show_default": True, "help": "ONNX Runtime intra-op threads (0 = default)."})
@click.option("--buckets", help="Kept-length buckets, e.g. 32,64,128 [default: powers of two up to the max length].")
@click.option("--max-gen-length", type=int, help="Longest response the engine runs [default: the last bucket, or "
              "what --max-prompt leaves of the export's positions].")
@click.option("--max-batch", type=int, default=8, show_default=True, help="Largest batch the profiles cover.")
@click.option("--max-prompt", type=int, help="Widest (padded) prompt the profiles cover [default: the export's "
              "positions minus the last bucket, or half of them].")
@click.option("--min-prompt", type=int, default=1, show_default=True, help="Narrowest prompt the profiles cover.")
@click.option("--kept-lengths", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Calibration kept lengths (JSON list or {length: count}): buckets minimising expected padding.")
@click.option("--max-buckets", type=int, help="At most this many buckets (profiles) when planning them.")
@click.option("--trt-library", type=click.Choice(["tensorrt", "tensorrt_rtx"]),
              help="Which TensorRT builds the engines: tensorrt (standard: data-centre GPUs, Jetson; builds on the GPU "
              "it targets) or tensorrt_rtx (RTX PCs and workstations, DGX Spark; builds without a GPU) [default: the "
              "one installed, standard first].")
@click.option("--compute-capability", "compute_capability",
              help="TensorRT-RTX: the GPUs' compute capabilities to build for, e.g. 8.9 or 8.6,12.0 (of 7.5, 8.0, 8.6, "
              "8.9, 12.0, 12.1; 7.5 needs an fp16 export) [default: the portable set, Ampere and later].")
@click.option("--max-pictures", type=int, help="TensorRT, multimodal exports: the most pictures a batch holds, which "
              "sizes the image table [default: as many as the widest prompts of the largest batch hold].")
@click.option("--timing-cache", type=click.Path(dir_okay=False, path_type=Path),
              help="Standard TensorRT's timing cache: read if it exists, updated after the build (skipped with a note "
              "on TensorRT-RTX, which has none).")
@click.option("--workspace", help="TensorRT builder workspace limit, e.g. 4G.")
@click.option("--window-lengths", help="TensorRT, export --kv-cache: the window_step engine's window lengths (the "
              "--block-length runs use), e.g. 32 or 16,32; one profile per (bucket, window length) [default: 32 and "
              "the last bucket].")
@click.option("--graph-optimization", type=click.Choice(["disable", "basic", "extended", "all"]), default="all",
              show_default=True, help="ONNX Runtime graph optimisation level.")
@click.option("--ort-save-optimized", is_flag=True, help="Also save ONNX Runtime's optimised graphs in the engine dir.")
@click.option("--force", is_flag=True, help="Replace an engine dir of another model in --out (never a directory "
              "holding files seer-deploy did not write).")
def command(export_dir: Path, out: Path, target_options: TargetOptions, buckets: str | None, max_gen_length: int | None,
            max_batch: int, max_prompt: int | None, min_prompt: int, kept_lengths: Path | None,
            max_buckets: int | None, trt_library: str | None, compute_capability: str | None,
            max_pictures: int | None, timing_cache: Path | None, workspace: str | None, window_lengths: str | None,
            graph_optimization: str, ort_save_optimized: bool, force: bool) -> None:
    """Build an engine dir from EXPORT_DIR (made by `seer-deploy export`).

    \b
    ort:       records the session settings (and checks the sessions open); optionally saves optimised graphs.
    tensorrt:  one engine per graph, one optimization profile per length bucket (TensorRT-RTX builds without a
               GPU, standard TensorRT on the GPU it targets); window_step gets one per bucket and window length,
               a multimodal export's vision graph one.
    """
    from seer_deploy.engines.buckets import parse_buckets, parse_window_lengths
    from seer_deploy.engines.build import BuildOptions, parse_size, prepare_build
    from seer_deploy.engines.tensorrt_library import parse_compute_capabilities
    from seer_deploy.runtime.openers import ort_session_options

    if buckets is not None and kept_lengths is not None:
        raise ConfigError("give --buckets or --kept-lengths, not both (--kept-lengths plans the buckets)")
    options = BuildOptions(
        backend="tensorrt" if target_options.backend == "tensorrt" else "ort",
        buckets=tuple(parse_buckets(buckets)) if buckets is not None else None,
        max_gen_length=max_gen_length,
        max_prompt=max_prompt,
        min_prompt=min_prompt,
        max_batch=max_batch,
        kept_lengths=read_kept_lengths(kept_lengths) if kept_lengths is not None else None,
        max_buckets=max_buckets,
        timing_cache=timing_cache,
        workspace_bytes=parse_size(workspace) if workspace is not None else None,
        window_lengths=tuple(parse_window_lengths(window_lengths)) if window_lengths is not None else None,
        trt_library=trt_library,
        compute_capabilities=parse_compute_capabilities(compute_capability) if compute_capability is not None else (),
        max_pictures=max_pictures,
        ort_session=replace(ort_session_options(target_options),
                            graph_optimization=graph_optimization),  # type: ignore[arg-type]  # click.Choice
        ort_save_optimized=ort_save_optimized,
        force=force,
    )
    run = prepare_build(export_dir, out, options)  # every check before the first progress line
    start = time.perf_counter()

    def progress(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:7.1f}s] {message}", err=True)

    result = run.start(progress)
    m = result.manifest
    cache = ""
    if m.has_cache:
        windows = m.window_layout
        cache = f", KV cache (windows {list(windows.windows)})" if windows is not None else ", KV cache"
    click.echo(f"engine dir: {result.out} ({m.backend}, buckets {list(m.buckets)}, batch 1..{m.max_batch}, "
               f"prompt {m.min_prompt}..{m.max_prompt}{cache}) in {result.seconds:.1f}s")
