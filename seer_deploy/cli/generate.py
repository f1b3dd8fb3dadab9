"""`seer-deploy generate`: answer prompts with a checkpoint (torch reference loop)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import torch

from seer_deploy.cli.options import generation_config, generation_options
from seer_deploy.errors import ConfigError
from seer_deploy.seer.config import SeerConfig


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


@click.command("generate")
@click.argument("target")
@click.option("--prompt", "-p", multiple=True, help="A prompt (repeat for a batch).")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of prompts: JSON lines with a 'prompt' field, or one prompt per line.")
@generation_options
@click.option("--seer/--no-seer", "use_seer", default=None,
              help="Truncate each response after step zero [default: on when a calibrated Seer config is found].")
@click.option("--seer-config", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Seer config from `seer-deploy calibrate` [default: the checkpoint's own, if any].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per prompt.")
def command(target: str, prompt: tuple[str, ...], prompts_file: Path | None, gen_length: int, steps: int | None,
            block_length: int | None, temperature: float, remasking: str, cfg_scale: float, seed: int,
            use_seer: bool | None, seer_config: Path | None, as_json: bool) -> None:
    """Generate answers for prompts with TARGET (a checkpoint directory or 'demo')."""
    from seer_deploy.models import Tokenizer, load_checkpoint
    from seer_deploy.runtime.reference import generate

    texts = read_prompts(prompt, prompts_file)
    config = generation_config(gen_length, steps, block_length, temperature, remasking, cfg_scale)
    config.validate()
    ckpt = load_checkpoint(target)
    seer = resolve_seer(target, use_seer, seer_config)
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id, ckpt.config.eot_id)
    ids = [tok.encode_prompt(t) for t in texts]
    result = generate(ckpt.model, ids, config, generator=torch.Generator().manual_seed(seed), seer=seer)
    reports = result.seer or [None] * len(texts)
    for text, row, report in zip(texts, result.tokens, reports, strict=True):
        answer = tok.decode_answer(row.tolist())
        if as_json:
            record: dict[str, object] = {"prompt": text, "answer": answer, "tokens": row.tolist()}
            if report is not None:
                record["seer"] = dataclasses.asdict(report)
            click.echo(json.dumps(record))
        else:
            click.echo(f"{text} -> {answer}")
    if result.seer and not as_json:
        kept = sum(r.kept for r in result.seer) / len(result.seer)
        full = sum(r.full_tokens_processed for r in result.seer)
        click.echo(f"seer ({result.seer[0].detector or 'forced'}): mean kept {kept:.1f} of {gen_length} slots, "
                   f"{result.tokens_processed} tokens processed ({result.tokens_processed / full:.2f}x full length)",
                   err=True)


def resolve_seer(target: str, use_seer: bool | None, seer_config: Path | None) -> SeerConfig | None:
    """The Seer config to run with: --seer-config, else the checkpoint's calibrated one; None = no truncation."""
    if use_seer is False:
        return None
    if seer_config is not None:
        return SeerConfig.load(seer_config)
    found = SeerConfig.for_checkpoint(target)
    if found is None and use_seer:
        click.echo("warning: no calibrated Seer config for this checkpoint; using the built-in defaults "
                   "(run `seer-deploy calibrate` for a safe margin)", err=True)
        return SeerConfig()
    return found
