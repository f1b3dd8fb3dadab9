"""`seer-deploy generate`: answer prompts with a checkpoint (torch reference loop)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch

from seer_deploy.cli.options import generation_config, generation_options
from seer_deploy.errors import ConfigError


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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per prompt.")
def command(target: str, prompt: tuple[str, ...], prompts_file: Path | None, gen_length: int, steps: int | None,
            block_length: int | None, temperature: float, remasking: str, cfg_scale: float, seed: int,
            as_json: bool) -> None:
    """Generate answers for prompts with TARGET (a checkpoint directory or 'demo')."""
    from seer_deploy.models import Tokenizer, load_checkpoint
    from seer_deploy.runtime.reference import generate

    texts = read_prompts(prompt, prompts_file)
    config = generation_config(gen_length, steps, block_length, temperature, remasking, cfg_scale)
    config.validate()
    ckpt = load_checkpoint(target)
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id, ckpt.config.eot_id)
    ids = [tok.encode_prompt(t) for t in texts]
    result = generate(ckpt.model, ids, config, generator=torch.Generator().manual_seed(seed))
    for text, row in zip(texts, result.tokens, strict=True):
        answer = tok.decode_answer(row.tolist())
        if as_json:
            click.echo(json.dumps({"prompt": text, "answer": answer, "tokens": row.tolist()}))
        else:
            click.echo(f"{text} -> {answer}")
