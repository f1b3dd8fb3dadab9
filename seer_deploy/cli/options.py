"""Click options shared by several verbs (generation settings), checked as soon as they are read.

`--steps` and `--block-length` default to gen-length only when they are not given: `--steps 0` is an error, not
"the default". `generation_config` validates the whole set, so a bad flag stops a verb before any work starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from seer_deploy.core.generation import GenerationConfig


def generation_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--gen-length, --steps, --block-length, --temperature, --remasking, --cfg-scale, --seed."""
    options = [
        click.option("--gen-length", type=int, default=64, show_default=True, help="Response slots (masks) to fill."),
        click.option("--steps", type=int, default=None, help="Denoising steps [default: gen-length]."),
        click.option("--block-length", type=int, default=None, help="Semi-autoregressive block [default: gen-length]."),
        click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy (deterministic)."),
        click.option(
            "--remasking",
            type=click.Choice(["low_confidence", "random"]),
            default="low_confidence",
            show_default=True,
            help="How each step picks the tokens it commits.",
        ),
        click.option("--cfg-scale", type=float, default=0.0, show_default=True, help="Classifier-free guidance."),
        click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
                     help="Seed for temperature > 0 / random."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def decoding_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--decode, --threshold, --factor, --kv-cache: the speed settings on top of Seer."""
    options = [
        click.option("--decode", type=click.Choice(["fixed", "threshold", "factor"]), default="fixed",
                     show_default=True,
                     help="fixed: LLaDA's even split of --steps per block. threshold / factor: Fast-dLLM's parallel "
                          "decoding, each step commits every candidate the rule accepts (at least one) and a block "
                          "ends when it has no masks, so the steps follow the model's confidence (--steps unused)."),
        click.option("--threshold", type=float, default=0.9, show_default=True,
                     help="--decode threshold: commit the candidates whose probability is at least this."),
        click.option("--factor", type=float, default=1.0, show_default=True,
                     help="--decode factor: commit the top n while the n-th probability is >= 1 - factor / (n + 1)."),
        click.option("--kv-cache", is_flag=True,
                     help="Block-wise dual KV cache (Fast-dLLM): refresh the keys and values at each block's first "
                          "step, run only the block in the others. Needs an export made with --kv-cache (or torch); "
                          "an approximation: answers may differ from the uncached run's. Pair it with "
                          "--block-length (Fast-dLLM uses 32)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def generation_config(
    gen_length: int,
    steps: int | None,
    block_length: int | None,
    temperature: float,
    remasking: str,
    cfg_scale: float,
    *,
    decode: str = "fixed",
    threshold: float = 0.9,
    factor: float = 1.0,
    kv_cache: bool = False,
) -> GenerationConfig:
    """The GenerationConfig of the flags, validated (ConfigError naming the flag); an unset --steps means
    gen-length, an unset --block-length one block."""
    config = GenerationConfig(
        gen_length=gen_length,
        steps=gen_length if steps is None else steps,
        block_length=block_length,
        temperature=temperature,
        remasking=remasking,  # type: ignore[arg-type]
        cfg_scale=cfg_scale,
        decode=decode,  # type: ignore[arg-type]
        threshold=threshold,
        factor=factor,
        kv_cache=kv_cache,
    )
    return config


def template_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--chat-template FILE, --no-chat-template: replace the target's own chat template, or send raw text."""
    options = [
        click.option("--chat-template", "chat_template", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="A Jinja chat template file to build prompts with, instead of the checkpoint's own "
                          "(tokenizer_config.json's chat_template, carried into the export)."),
        click.option("--no-chat-template", "raw_prompts", is_flag=True,
                     help="Send prompts as raw text, without a chat template (base models)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func
