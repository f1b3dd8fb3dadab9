"""`seer-deploy inspect`: draw what Seer sees at step zero for one prompt, next to the true end of its answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from seer_deploy.cli.options import generation_options, seer_options
from seer_deploy.cli.verbs import summary
from seer_deploy.runtime.targets import find_seer_config

if TYPE_CHECKING:
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.seer.options import SeerOptions


@click.command("inspect", short_help=summary("inspect"))
@click.argument("target")
@click.option("--prompt", "-p", required=True, help="The prompt to inspect.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the figure (PNG).")
@generation_options("gen_length", "steps", "block_length",
                    steps={"help": "Denoising steps of the full-length run [default: gen-length]."})
@seer_options("config", config={"help": "Seer config [default: the checkpoint's calibrated one, else built-in "
                                        "defaults]."})
@click.option("--json", "as_json", is_flag=True, help="Also print the per-position numbers as one JSON object.")
def command(target: str, prompt: str, out: Path, generation: GenerationConfig, seer: SeerOptions,
            as_json: bool) -> None:
    """Plot per-position MLP statistics of every layer, the EOS probability, the detected boundaries and the true end."""
    from seer_deploy.calibration.figure import save_figure
    from seer_deploy.calibration.inspection import inspect_prompt
    from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
    from seer_deploy.models.text.tokenizer import Tokenizer
    from seer_deploy.seer.config import SeerConfig

    config = generation
    ckpt = load_checkpoint(target)
    given = seer.config
    seer_config = SeerConfig.load(given) if isinstance(given, Path) else given or find_seer_config(target) or SeerConfig()
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id, ckpt.config.eot_id)
    ids = tok.encode_prompt(prompt)
    config.check_fits(ckpt.config.max_seq_len, len(ids))
    inspection = inspect_prompt(ckpt.model, ids, config, seer_config)
    save_figure(inspection, out, title=repr(prompt))
    if as_json:
        data = inspection.to_dict()
        data["prompt"] = prompt
        data["answer"] = tok.decode_answer(inspection.answer.tolist())
        click.echo(json.dumps(data))
    else:
        b = inspection.boundaries
        click.echo(f"{prompt}: true end {inspection.true_end}; eos {b['eos'].position}, sparsity {b['sparsity'].position} "
                   f"(score {b['sparsity'].confidence:.2f}), fused {b['fused'].position}; "
                   f"{seer_config.detector} keeps {inspection.kept[seer_config.detector]} of {config.gen_length}")
        click.echo(f"wrote {out}")
