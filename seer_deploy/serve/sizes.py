"""From an OpenAI request's `max_tokens` (and the Seer extras `steps`, `block_length`) to the GenerationConfig it
runs with.

The rule (docs/serving.md): `max_tokens` rounds UP to the smallest supported response size (the server's
`--gen-lengths`, by default the powers of two from 16 up to what fits the model's positions); no `max_tokens` means
the server's `--gen-length`. The answer is then cut to `max_tokens` tokens (finish_reason "length"). Why round:
a diffusion LM fills a canvas of gen_length masks, and its answer depends on the canvas size; few sizes mean
requests share batches (one batch runs one size), answers repeat exactly across requests, and Seer has calibrated
trends for them. `steps` defaults to the server's tokens-per-step ratio (--steps / --gen-length; 1 by default).
"""

from __future__ import annotations

import dataclasses
import math

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig

SMALLEST = 16


def supported_sizes(configured: tuple[int, ...], default: int, max_seq_len: int | None) -> tuple[int, ...]:
    """The response sizes a server runs, ascending: the configured ones (its default gen_length always among
    them), or the powers of two from 16 below the model's positions."""
    if configured:
        return tuple(sorted({*configured, default}))
    limit = max_seq_len if max_seq_len is not None else 4096
    sizes = {1 << p for p in range(SMALLEST.bit_length() - 1, 13) if 1 << p < limit}
    return tuple(sorted({*sizes, default}))


def gen_length_for(max_tokens: int | None, sizes: tuple[int, ...], default: int) -> int:
    """The response size a request runs at (see the module's rule); ConfigError for a max_tokens out of reach."""
    if max_tokens is None:
        return default
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"max_tokens is {max_tokens!r}; it must be a positive integer")
    for size in sizes:
        if size >= max_tokens:
            return size
    raise ConfigError(f"max_tokens {max_tokens} is above the largest response size this server runs ({sizes[-1]}); "
                      f"lower max_tokens (sizes: {', '.join(map(str, sizes))})")


def request_generation(base: GenerationConfig, gen_length: int, steps: int | None, block_length: int | None,
                       temperature: float | None) -> GenerationConfig:
    """The server's generation settings at this request's size: its steps (else the server's tokens per step),
    block length (else the server's, else one block) and temperature; validated (ConfigError names the field)."""
    block = block_length if block_length is not None else base.block_length
    if block is not None and block >= gen_length:
        block = None if block_length is None else block  # the server's block covers this whole canvas: one block
    if steps is None:
        n_blocks = gen_length // (block or gen_length) if gen_length % (block or gen_length) == 0 else 1
        per_step = base.gen_length / base.steps
        steps = max(n_blocks, math.ceil(gen_length / per_step / n_blocks) * n_blocks)
    config = dataclasses.replace(base, gen_length=gen_length, steps=steps, block_length=block,
                                 temperature=base.temperature if temperature is None else temperature)
    return config  # checked when made
