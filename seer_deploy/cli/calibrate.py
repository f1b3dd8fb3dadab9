"""`seer-deploy calibrate`: choose Seer's detector settings and margin for a checkpoint or an export on a prompt set,
and optionally (`--target-identical`) the margin and tail context end to end against full-length answers. A
multimodal target is calibrated the same way, on prompts with pictures (calibration.prompt_set); an export (quantized
or not) on its own step zero and runtime-loop answers (calibration.sources)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from seer_deploy.cli.options import generation_options, seed_option, seer_options, target_options
from seer_deploy.cli.verbs import summary
from seer_deploy.core.checks import ascii_ints
from seer_deploy.core.errors import ConfigError
from seer_deploy.seer.config import parse_tail_context

if TYPE_CHECKING:
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.runtime.targets import TargetOptions
    from seer_deploy.seer.options import SeerOptions


def parse_buckets(text: str | None) -> tuple[int, ...]:
    """'16,32,64' -> (16, 32, 64)."""
    if not text:
        return ()
    parsed = ascii_ints(text)
    if parsed is None:
        raise ConfigError(f"--buckets '{text}' is not a comma-separated list of lengths in digits 0-9 (e.g. 16,32,64)")
    values = tuple(sorted(set(parsed)))
    if any(v < 1 for v in values):
        raise ConfigError(f"--buckets '{text}' has a length below 1")
    return values


@click.command("calibrate", short_help=summary("calibrate"))
@click.argument("target")
@click.option("--prompts", "prompts_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Calibration prompts: JSON lines with a 'prompt' field, or one prompt per line. For a multimodal "
                   "checkpoint a line may add 'image': a path, or a list of paths, one per <image> in the prompt, in "
                   "order (relative to this file).")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the Seer config (JSON).")
@click.option("--target-safe", type=float, default=0.995, show_default=True,
              help="Share of answers that must be kept whole.")
@generation_options("gen_length", "steps", "block_length", gen_length={"help": "Response slots to calibrate for."})
@click.option("--detector", type=click.Choice(["fused", "eos", "sparsity"]), default="fused", show_default=True,
              help="The detector the written config uses (all three are calibrated and reported).")
@click.option("--holdout", type=float, default=0.5, show_default=True, help="Share of prompts held out to validate.")
@click.option("--min-margin", type=int, default=0, show_default=True, help="Never keep fewer slots past the boundary.")
@click.option("--buckets", default=None, help="Allowed kept lengths, e.g. 16,32,64,128 [default: any].")
@seer_options("tail_context", tail_context={
    "default": "0", "show_default": True,
    "help": "Written to the config: cut slots the later steps still run as committed EOS (0: the paper's cut; 'all': "
            "the whole tail, slower, answers closer to full length's); --target-identical starts there."})
@click.option("--target-identical", type=float, default=None,
              help="Also fit the margin end to end: the first whose answers equal full length's on this share of "
                   "the calibration prompts (validated on the rest). A few more Seer runs. [default: off]")
@click.option("--identity-tail-contexts", default="", metavar="N,..|all",
              help="With --target-identical: if no margin reaches it, try these tail contexts at the knee margin, "
                   "cheapest first (fewest slots, 'all' last; e.g. 32,all); the first reaching it is written.")
@click.option("--identity-margin-span", type=int, default=16, show_default=True,
              help="With --target-identical: margins tried, from the safe-rate one up to this many more in steps of 2.")
@click.option("--batch-size", type=int, default=64, show_default=True)
@seed_option(seed={"help": "Seed of the calibration/validation split."})
@target_options("threads", threads={"help": "An export's ONNX Runtime intra-op threads [default: ONNX Runtime's]."})
def command(target: str, prompts_file: Path, out: Path, target_safe: float, generation: GenerationConfig,
            detector: str, holdout: float, min_margin: int, buckets: str | None, seer: SeerOptions,
            target_identical: float | None, identity_tail_contexts: str, identity_margin_span: int, batch_size: int,
            seed: int, target_options: TargetOptions) -> None:
    """Calibrate Seer for TARGET and write the config to --out.

    TARGET is a checkpoint directory or 'demo'; or a multimodal one, 'demo-vl' or a LLaDA-V-layout directory, whose
    prompts may hold pictures (see --prompts): each picture is encoded once by the checkpoint's vision tower. A
    prompts line with a picture: {"prompt": "<image> What is shown?", "image": "pictures/1.png"}.

    TARGET may also be an export directory (quantized or not): step zero and the full-length answers then come from
    the export on ONNX Runtime, and the statistics are the ones its graph reports (its stats layers at its one
    threshold pair: no threshold sweep). Put the written file in the export directory as seer.json to make it the
    export's own.
    """
    from seer_deploy.calibration.detector_fit import CalibrationOptions, calibrate_model, split_indices
    from seer_deploy.calibration.identity_fit import (
        IdentityGoal,
        SeerRuns,
        check_target_identical,
        fit_identity_on_split,
    )
    from seer_deploy.calibration.prompt_set import prepare_prompts
    from seer_deploy.models.families.families import authors_rule
    from seer_deploy.models.prompts.prompt import read_prompts_file

    options = CalibrationOptions(target_safe=target_safe, holdout=holdout, seed=seed, detector=detector,
                                 min_margin=min_margin, buckets=parse_buckets(buckets))
    options.validate()
    context = seer.tail_context if seer.tail_context is not None else 0
    try_contexts = [parse_tail_context(v.strip()) for v in identity_tail_contexts.split(",") if v.strip()]
    if target_identical is not None:
        check_target_identical(target_identical)
    if identity_margin_span < 0:
        raise ConfigError(f"--identity-margin-span {identity_margin_span} must be >= 0")
    if try_contexts and target_identical is None:
        raise ConfigError("--identity-tail-contexts needs --target-identical (the share they are tried to reach)")
    config = generation
    if batch_size < 1:
        raise ConfigError("--batch-size must be >= 1")
    prompts = read_prompts_file(prompts_file)
    split_indices(len(prompts), holdout, seed)  # enough prompts to split
    # input errors before any model runs
    prepared = prepare_prompts(target, prompts, config, batch_size, target_options.threads)
    source, ids = prepared.source, prepared.ids
    if config.block_length is None:  # the family's own rule, as generate runs it (Dream's sampler for the Dream family)
        config = dataclasses.replace(config, **authors_rule(source.cfg.family, source.cfg.prefix_dlm))  # type: ignore[arg-type]
    full, _ = source.answers(ids, config, batch_size=batch_size,
                             progress=lambda done, total: click.echo(f"full-length generation: {done}/{total}", err=True))
    result = calibrate_model(source, ids, config, options, full_tokens=full, batch_size=batch_size)
    report = result.report | {"n_images": prepared.n_images, "decode": config.decode, "remasking": config.remasking}
    written = result.config.with_(tail_context=context, calibration=report)
    if target_identical is not None:
        goal = IdentityGoal(target_identical, tuple(try_contexts), identity_margin_span)
        fit, validation = fit_identity_on_split(SeerRuns(source, ids, config, batch_size), written, full, options, goal,
                                                log=lambda line: click.echo(line, err=True))
        report = report | {"identity_margin": fit.to_dict() | {"identical": fit.identical,
                                                                "validation_identical": round(validation, 4)}}
        written = written.with_(margin=fit.margin, tail_context=fit.tail_context, calibration=report)
    written.save(out)
    pictures = f", {prepared.n_images} pictures" if prepared.n_images else ""
    click.echo(f"{len(ids)} prompts{pictures} ({report['n_calibration']} calibration / {report['n_validation']} "
               f"validation), gen_length {config.gen_length}, mean true length {report['mean_true_length']}")
    for name, entry in report["detectors"].items():
        cal, val = entry["calibration"], entry["validation"]
        mark = " (written)" if name == detector else ""
        click.echo(f"  {name:9s} margin {entry['margin']:3d}  safe {cal['safe']:.3f} / {val['safe']:.3f}  "
                   f"mean kept {cal['mean_kept']:.1f} / {val['mean_kept']:.1f}  (calibration / validation){mark}")
    click.echo(f"  sparsity: {report['sparsity_choice']}")
    statistics = report["statistics"]
    if not statistics["swept"]:
        click.echo(f"  statistics: the export's own (layers {statistics['layers']}, thresholds "
                   f"{statistics['thresholds'][0]}): its graph computes one threshold pair, so none was swept")
    if "identity_margin" in report:
        fit_report = report["identity_margin"]
        click.echo(f"  end to end: margin {fit_report['margin']}, tail context {fit_report['tail_context']} "
                   f"({fit_report['rule']}); identical to full length {fit_report['identical']:.3f} / "
                   f"{fit_report['validation_identical']:.3f} (calibration / validation)")
    click.echo(f"wrote {out}")
