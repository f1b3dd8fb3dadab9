"""`seer-deploy export`: a checkpoint -> step.onnx, weights.bin and manifest.json, validated (with --kv-cache also
window_step.onnx).

A multimodal checkpoint ('demo-vl' or LLaDA-V's layout) also gets vision.onnx, and its step graphs take the image
embeddings (seer_deploy.export.multimodal)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from seer_deploy.cli.options import generation_options, seer_options
from seer_deploy.cli.verbs import summary

if TYPE_CHECKING:
    from seer_deploy.contracts.quantization import Quantization
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.seer.options import SeerOptions

GiB = 2**30


class StageProgress:
    """What `export` shows of a long run: a line per stage with its time and, while the weights file is written, a
    bar of bytes with the tensor being written; with `as_json`, one JSON object per event on stderr instead."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.stage = ""
        self.started = self.stage_started = time.perf_counter()
        self.bar: Any = None

    def __call__(self, stage: str, /, *, done: int = 0, total: int = 0, item: str = "") -> None:
        now = time.perf_counter()
        if self.as_json:
            event = {"stage": stage, "elapsed_s": round(now - self.started, 3)}
            if total:
                event |= {"bytes_done": done, "bytes_total": total, **({"tensor": item} if item else {})}
            click.echo(json.dumps(event), err=True)
            return
        if stage != self.stage:
            self.finish()
            self.stage, self.stage_started = stage, now
            if total:
                self.bar = click.progressbar(length=total, label=f"  {stage}", file=sys.stderr, show_eta=True,
                                             item_show_func=lambda name: name)
                self.bar.__enter__()
            else:
                click.echo(f"  {stage} ...", err=True)
        if self.bar is not None and done:
            self.bar.update(done - self.bar.pos, f"{done / GiB:.2f}/{total / GiB:.2f} GiB {item}")

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
        if self.stage and not self.as_json:
            click.echo(f"  {self.stage}: {time.perf_counter() - self.stage_started:.1f}s", err=True)


@click.command("export", short_help=summary("export"))
@click.argument("checkpoint")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Export directory to create.")
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16", "bf16"]),
    default="fp32",
    show_default=True,
    help="Weight and activation type (bf16 is refused: ONNX Runtime's CPU provider has no bf16 kernels).",
)
@click.option("--opset", type=int, default=None, help="ONNX opset (18 or newer) [default: 20; 21 with --quant-format "
              "qdq].")
@click.option("--max-seq-len", type=int, default=None, help="Longest prompt + response [default: the model's].")
@seer_options("config", config={
    "help": "A Seer config (seer.json from `seer-deploy calibrate`): step zero computes the statistics it reads "
            "(stats_layers, abs_threshold, rel_threshold) [default: the checkpoint's own seer.json, else every layer "
            "at 0.05 / 0.05]."})
@click.option("--force", is_flag=True, help="Replace an export of another model in --out (never a directory holding "
              "files seer-deploy did not write).")
@click.option("--no-verify", is_flag=True, help="Skip the ONNX Runtime vs torch comparison (the ONNX checker still runs). "
              "A comparison that fails keeps the export, marked unverified in its manifest, and exits 1.")
@generation_options("kv_cache", kv_cache={"help": "Also export the block-wise KV cache: window_step.onnx, and keys and "
                                                  "values from step.onnx, which `generate --kv-cache` runs: each "
                                                  "block's later steps run only the block."})
@click.option("--no-resource-check", is_flag=True, help="Start even when the free disk or the available memory looks "
              "too small for the export (checked from the checkpoint's tensor shapes before anything is written).")
@click.option("--quantize", type=click.Choice(["int8", "int4"]), default=None,
              help="Weight-only quantization of the language model's linear layers (symmetric, blocks along the input "
              "rows, by ONNX Runtime's quantizer); the embedding, norms and vision tower keep --dtype.")
@click.option("--block-size", type=int, default=None,
              help="Weights per quantization block with --quantize: 16, 32, 64, 128 or 256 [default: 32].")
@click.option("--quant-format", type=click.Choice(["nbits", "qdq"]), default=None,
              help="nbits: ONNX Runtime's MatMulNBits (CPU and CUDA); qdq: DequantizeLinear + MatMul, what TensorRT "
              "builds quantized engines from (ONNX Runtime runs it too) [default: nbits; qdq with --build tensorrt].")
@click.option("--keep-head", is_flag=True, help="With --quantize: keep the LM head (the vocabulary projection) in "
              "--dtype, as llama.cpp's q4_0 keeps its output projection at higher precision.")
@click.option("--json", "as_json", is_flag=True, help="Progress as JSON lines on stderr and the result as one JSON "
              "object on stdout, for scripts.")
@click.option("--build", "build", type=click.Choice(["ort", "tensorrt"]), default=None,
              help="Then build an engine dir for this backend into OUT/engine (default build settings).")
def command(
    checkpoint: str,
    out: Path,
    dtype: str,
    opset: int,
    max_seq_len: int | None,
    seer: SeerOptions,
    force: bool,
    no_verify: bool,
    generation: GenerationConfig,
    no_resource_check: bool,
    quantize: str | None,
    block_size: int | None,
    quant_format: str | None,
    keep_head: bool,
    as_json: bool,
    build: str | None,
) -> None:
    """Export CHECKPOINT (a local directory, 'demo' or 'demo-vl') to ONNX graphs in --out, checked against torch.

    A multimodal CHECKPOINT (LLaDA-V's layout) also gets vision.onnx: pixels -> image embeddings."""
    from seer_deploy.contracts.multimodal import VISION_FILE
    from seer_deploy.contracts.quantization import QDQ_MIN_OPSET
    from seer_deploy.core.errors import ConfigError
    from seer_deploy.engines.build import BuildOptions, build_engines
    from seer_deploy.export.dimple import prepare_with_pictures
    from seer_deploy.export.exporter import prepare_export
    from seer_deploy.export.options import DEFAULT_OPSET, ExportOptions
    from seer_deploy.models.checkpoints.multimodal_files import is_multimodal_checkpoint
    from seer_deploy.seer.config import SeerConfig

    quantization = quantization_option(quantize, block_size, quant_format, keep_head, build)
    options = ExportOptions(
        dtype=dtype,
        opset=opset or (QDQ_MIN_OPSET if quantization is not None and quantization.format == "qdq" else DEFAULT_OPSET),
        max_seq_len=max_seq_len,
        seer=SeerConfig.load(seer.config) if isinstance(seer.config, Path) else seer.config,
        verify=not no_verify,
        force=force,
        kv_cache=generation.kv_cache,  # the graphs `generate --kv-cache` runs
        check_resources=not no_resource_check,
        quantization=quantization,
    )
    options.validate()
    multimodal = is_multimodal_checkpoint(checkpoint)
    if multimodal and build == "tensorrt":
        raise ConfigError(
            f"{checkpoint} is a multimodal checkpoint: TensorRT engines are built from text exports only (no profile "
            "plan covers the image-table input yet); use --build ort, or export without --build"
        )
    build_options = BuildOptions(backend="tensorrt" if build == "tensorrt" else "ort")
    if build is not None:
        build_options.check()  # TensorRT installed, before the export: the user learns at once
    run = (prepare_with_pictures if multimodal else prepare_export)(checkpoint, out, options)
    if build is not None:
        build_options.layout(run.max_seq_len)  # the default profiles fit the export's length
    progress = StageProgress(as_json)
    try:
        result = run.start(progress)
    finally:
        progress.finish()
    m = result.manifest
    vision = [VISION_FILE] if multimodal else []
    files = vision + [g.file for g in m.graphs.values()] + [m.weights.file]
    built = None
    if build is not None:
        say = (lambda message: None) if as_json else (lambda message: click.echo(f"  {message}", err=True))
        built = build_engines(result.out, result.out / "engine", build_options, progress=say)
    if as_json:
        click.echo(json.dumps({
            "out": str(result.out), "source": m.model.source, "layout": m.model.layout, "dtype": m.dtype,
            "opset": m.opset, "max_seq_len": m.max_seq_len, "seconds": round(result.seconds, 3), "files": files,
            "weights_bytes": m.weights.bytes, "sparsity_rows": len(m.seer.sparsity_rows),
            "quantization": m.weights.quantization.to_dict() if m.weights.quantization else None,
            "verified": bool(result.max_diff), "max_diff": result.max_diff,
            **({"engine_dir": str(built.out), "buckets": list(built.manifest.buckets)} if built else {}),
        }))
        return
    click.echo(
        f"exported {m.model.source} ({m.model.layout} layout, {m.dtype}, opset {m.opset}, max_seq_len {m.max_seq_len}) "
        f"to {result.out} in {result.seconds:.1f}s"
    )
    click.echo(
        f"  {', '.join(files[:-1])}, {m.weights.file} ({m.weights.bytes / 2**20:.1f} MiB, one copy for every graph), "
        f"{len(m.seer.sparsity_rows)} sparsity rows"
    )
    if m.weights.quantization is not None:
        click.echo(f"  quantized {m.weights.quantization.describe()}: "
                   + ", ".join(f"{n} projections in {g}" for g, n in m.extra["quantized"]["projections"].items()))
    if result.max_diff and m.weights.quantization is not None:
        d = result.max_diff
        click.echo(f"  ONNX Runtime vs torch: the same token at {d['token agreement']:.1%} of {d['positions']:.0f} "
                   f"positions (bound {d['bound: min agreement']:.0%}; exactly the argmax at "
                   f"{d['exact token agreement']:.1%}), sparsity max |diff| {d['sparsity max |diff|']:.2g}")
    elif result.max_diff:
        own = {k: v for k, v in result.max_diff.items() if "torch itself" in k}
        diffs = ", ".join(f"{k} {v:.2g}" for k, v in sorted(result.max_diff.items()) if k not in own)
        click.echo(f"  ONNX Runtime vs torch, max |diff|: {diffs}")
        if own:  # what the export's dtype alone moves, the basis of its tolerances (export.validate)
            click.echo("  allowed for " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(own.items())))
    else:
        click.echo("  not compared with torch (--no-verify)")
    if built is not None:
        click.echo(f"  engine dir: {built.out} ({build}, buckets {list(built.manifest.buckets)}) in {built.seconds:.1f}s; "
                   f"run it with: seer-deploy generate {built.out} -p PROMPT")


def quantization_option(scheme: str | None, block_size: int | None, form: str | None, keep_head: bool,
                        build: str | None) -> Quantization | None:
    """--quantize and its companions as one record; ConfigError for a companion without --quantize, or a form the
    --build backend cannot read."""
    from seer_deploy.contracts.quantization import DEFAULT_BLOCK_SIZE, Quantization
    from seer_deploy.core.errors import ConfigError

    if scheme is None:
        given = [flag for flag, value in (("--block-size", block_size), ("--quant-format", form),
                                          ("--keep-head", keep_head or None)) if value is not None]
        if given:
            raise ConfigError(f"{', '.join(given)} only apply with --quantize int8 or int4; add --quantize or drop them")
        return None
    if build == "tensorrt" and form == "nbits":
        raise ConfigError("TensorRT reads quantized weights as DequantizeLinear + MatMul, not ONNX Runtime's "
                          "MatMulNBits: use --quant-format qdq with --build tensorrt")
    return Quantization(scheme, block_size or DEFAULT_BLOCK_SIZE, form or ("qdq" if build == "tensorrt" else "nbits"),
                        keep_head)
