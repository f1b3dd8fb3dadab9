"""`seer-deploy export`: a checkpoint -> step.onnx, weights.bin and manifest.json, validated (with --kv-cache also
window_step.onnx).

A multimodal checkpoint ('demo-vl' or LLaDA-V's layout) also gets vision.onnx, and its step graphs take the image
embeddings (seer_deploy.export.multimodal)."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("export")
@click.argument("checkpoint")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Export directory to create.")
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16", "bf16"]),
    default="fp32",
    show_default=True,
    help="Weight and activation type (bf16 is refused: ONNX Runtime's CPU provider has no bf16 kernels).",
)
@click.option("--opset", type=int, default=20, show_default=True, help="ONNX opset (18 or newer).")
@click.option("--max-seq-len", type=int, default=None, help="Longest prompt + response [default: the model's].")
@click.option(
    "--seer-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON with stats_layers / abs_threshold / rel_threshold for the step-zero statistics [default: all layers].",
)
@click.option("--force", is_flag=True, help="Replace an export of another model in --out (never a directory holding "
              "files seer-deploy did not write).")
@click.option("--no-verify", is_flag=True, help="Skip the ONNX Runtime vs torch comparison (the ONNX checker still runs). "
              "A comparison that fails keeps the export, marked unverified in its manifest, and exits 1.")
@click.option("--kv-cache", is_flag=True, help="Also export the block-wise KV cache: window_step.onnx, and keys and "
              "values from step.onnx, which `generate --kv-cache` runs: each block's later steps run only the block.")
@click.option("--build", "build", type=click.Choice(["ort", "tensorrt"]), default=None,
              help="Then build an engine dir for this backend into OUT/engine (default build settings).")
def command(
    checkpoint: str,
    out: Path,
    dtype: str,
    opset: int,
    max_seq_len: int | None,
    seer_config: Path | None,
    force: bool,
    no_verify: bool,
    kv_cache: bool,
    build: str | None,
) -> None:
    """Export CHECKPOINT (a local directory, 'demo' or 'demo-vl') to ONNX graphs in --out, checked against torch.

    A multimodal CHECKPOINT (LLaDA-V's layout) also gets vision.onnx: pixels -> image embeddings."""
    from seer_deploy.core.errors import ConfigError
    from seer_deploy.engines.build import BuildOptions, build_engines
    from seer_deploy.export.exporter import STAGES, prepare_export
    from seer_deploy.export.multimodal import prepare_multimodal
    from seer_deploy.export.options import ExportOptions, SeerStats, load_seer_stats
    from seer_deploy.models.multimodal_files import is_multimodal_checkpoint
    from seer_deploy.spec.multimodal import VISION_FILE

    options = ExportOptions(
        dtype=dtype,
        opset=opset,
        max_seq_len=max_seq_len,
        seer=load_seer_stats(seer_config) if seer_config is not None else SeerStats(),
        verify=not no_verify,
        force=force,
        kv_cache=kv_cache,
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
    run = (prepare_multimodal if multimodal else prepare_export)(checkpoint, out, options)
    if build is not None:
        build_options.layout(run.max_seq_len)  # the default profiles fit the export's length
    with click.progressbar(
        length=len(STAGES), label="exporting", file=sys.stderr, item_show_func=lambda s: s, show_eta=False
    ) as bar:
        done = [0]

        def progress(stage: str) -> None:
            index = STAGES.index(stage) if stage in STAGES else done[0]
            bar.update(max(index - done[0], 0), stage)
            done[0] = max(index, done[0])

        result = run.start(progress)
        bar.update(len(STAGES) - done[0], "done")
    m = result.manifest
    weights_mb = m.weights.bytes / 2**20
    click.echo(
        f"exported {m.model.source} ({m.model.layout} layout, {m.dtype}, opset {m.opset}, max_seq_len {m.max_seq_len}) "
        f"to {result.out} in {result.seconds:.1f}s"
    )
    vision = [VISION_FILE] if multimodal else []
    click.echo(
        f"  {', '.join(vision + [g.file for g in m.graphs.values()])}, {m.weights.file} ({weights_mb:.1f} MiB, one "
        f"copy for every graph), {len(m.seer.sparsity_rows)} sparsity rows"
    )
    if result.max_diff:
        own = {k: v for k, v in result.max_diff.items() if "torch itself" in k}
        diffs = ", ".join(f"{k} {v:.2g}" for k, v in sorted(result.max_diff.items()) if k not in own)
        click.echo(f"  ONNX Runtime vs torch, max |diff|: {diffs}")
        if own:  # what the export's dtype alone moves, the basis of its tolerances (export.validate)
            click.echo("  allowed for " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(own.items())))
    else:
        click.echo("  not compared with torch (--no-verify)")
    if build is not None:
        say = lambda message: click.echo(f"  {message}", err=True)
        built = build_engines(result.out, result.out / "engine", build_options, progress=say)
        click.echo(f"  engine dir: {built.out} ({build}, buckets {list(built.manifest.buckets)}) in {built.seconds:.1f}s; "
                   f"run it with: seer-deploy generate {built.out} -p PROMPT")
