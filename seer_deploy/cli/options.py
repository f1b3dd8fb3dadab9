"""Click options shared by several verbs (generation settings), checked as soon as they are read.

`--steps` and `--block-length` default to gen-length only when they are not given: `--steps 0` is an error, not
"the default". `generation_config` validates the whole set, so a bad flag stops a verb before any work starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from seer_deploy.core.decoding import DREAM_DECODES, DREAM_REMASKING
from seer_deploy.core.generation import DECODE_CHOICES, REMASKING_CHOICES, GenerationConfig


def generation_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--gen-length, --steps, --block-length, --temperature, --remasking, --cfg-scale, --seed."""
    options = [
        click.option("--gen-length", type=int, default=64, show_default=True, help="Response slots (masks) to fill."),
        click.option("--steps", type=int, default=None, help="Denoising steps [default: gen-length]."),
        click.option("--block-length", type=int, default=None, help="Semi-autoregressive block [default: gen-length]."),
        click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy (deterministic)."),
        click.option(
            "--remasking",
            type=click.Choice(REMASKING_CHOICES),
            default=None,
            help="How each step picks the tokens it commits: LLaDA's low_confidence / random, or with the Dream "
                 "family's --decode timesteps / confident Dream's alg: origin, maskgit_plus, topk_margin, entropy "
                 "[default: the family's own, as its authors' evaluation runs it: LLaDA low_confidence, Dream "
                 "entropy, Dimple maskgit_plus, LaViDa-Dream topk_margin].",
        ),
        click.option("--cfg-scale", type=float, default=0.0, show_default=True, help="Classifier-free guidance."),
        click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
                     help="Seed for temperature > 0 / random."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def decoding_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--decode, --threshold, --factor, --eps, --alg-temp, --top-p, --top-k, --kv-cache, --prompt-cache: the decoding
    rule and the caches."""
    options = [
        click.option("--decode", type=click.Choice(DECODE_CHOICES), default=None,
                     help="fixed: LLaDA's even split of --steps per block. threshold / factor: Fast-dLLM's parallel "
                          "decoding, each step commits every candidate the rule accepts (at least one) and a block "
                          "ends when it has no masks, so the steps follow the model's confidence (--steps unused). "
                          "timesteps: Dream's sampler (no blocks; step i of --steps commits int(masks * (1 - t[i+1] "
                          "/ t[i])), t = linspace(1, --eps, steps + 1)). confident: Dimple's confident decoding "
                          "(every mask scoring above --threshold, else the schedule re-anchored at the masks left; "
                          "it stops when none is left) [default: the family's own: LLaDA fixed, the Dream family "
                          "timesteps]."),
        click.option("--threshold", type=float, default=0.9, show_default=True,
                     help="--decode threshold: commit the candidates whose probability is at least this; --decode "
                          "confident: those whose score is above it (Dimple's alg_p_threshold)."),
        click.option("--eps", type=float, default=1e-3, show_default=True,
                     help="--decode timesteps / confident: the last timestep, in (0, 1)."),
        click.option("--alg-temp", type=float, default=0.0, show_default=True,
                     help="--decode timesteps / confident: > 0 draws the committed positions from "
                          "softmax(score / alg-temp) instead of taking the top scores."),
        click.option("--top-p", type=float, default=None,
                     help="--decode timesteps / confident: nucleus filter before the softmax, in (0, 1] (the torch "
                          "backend only: the graphs return no vocabulary)."),
        click.option("--top-k", type=int, default=None,
                     help="--decode timesteps / confident: top-k filter before the softmax (torch backend only)."),
        click.option("--factor", type=float, default=1.0, show_default=True,
                     help="--decode factor: commit the top n while the n-th probability is >= 1 - factor / (n + 1)."),
        click.option("--kv-cache", is_flag=True,
                     help="Block-wise dual KV cache (Fast-dLLM): refresh the keys and values at each block's first "
                          "step, run only the block in the others. Needs an export made with --kv-cache (or torch); "
                          "an approximation: answers may differ from the uncached run's. Pair it with "
                          "--block-length (Fast-dLLM uses 32)."),
        click.option("--prompt-cache", is_flag=True,
                     help="Prompt cache: step zero's keys and values of the prompt (all but its last token) are kept "
                          "and every later pass runs the last prompt token and the answer only. Exact with prefix-DLM "
                          "attention (LaViDa: its authors' cache); elsewhere Dimple's prefilling, an approximation. "
                          "Needs an export made with --kv-cache (or torch)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def generation_config(
    gen_length: int,
    steps: int | None,
    block_length: int | None,
    temperature: float,
    remasking: str | None,
    cfg_scale: float,
    *,
    decode: str | None = None,
    threshold: float = 0.9,
    factor: float = 1.0,
    kv_cache: bool = False,
    prompt_cache: bool = False,
    eps: float = 1e-3,
    alg_temp: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
) -> GenerationConfig:
    """The GenerationConfig of the flags, validated (ConfigError naming the flag); an unset --steps means
    gen-length, an unset --block-length one block. An unset --decode / --remasking is LLaDA's here, the family's own
    once the target is open (`ServiceOptions.authors_rule`); a Dream rule named alone brings Dream's sampler."""
    if decode is None:
        decode = "timesteps" if remasking in DREAM_REMASKING else "fixed"
    if remasking is None:
        remasking = "maskgit_plus" if decode in DREAM_DECODES else "low_confidence"
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
        prompt_cache=prompt_cache,
        eps=eps,
        alg_temp=alg_temp,
        top_p=top_p,
        top_k=top_k,
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


def authors_rule(decode: str | None, remasking: str | None, block_length: int | None, kv_cache: bool) -> bool:
    """Whether the family's own rule applies (ServiceOptions.authors_rule): no rule named, no blocks, no block-wise
    cache (the prompt cache runs every rule)."""
    return decode is None and remasking is None and block_length is None and not kv_cache
