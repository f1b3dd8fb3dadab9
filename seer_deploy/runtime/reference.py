"""The reference denoising loop: LLaDA's `generate` semantics in torch eager.

Every other backend is compared with this loop. Semantics (LLaDA): the response is `gen_length` masks split into
blocks of `block_length`; `steps` are split evenly across blocks; inside a block the masked positions are committed
over its steps by an even split (the remainder goes to the first steps). Each step runs the whole sequence, picks
x0 = argmax (Gumbel-max in float64 when temperature > 0), scores masked positions of the current block by the
softmax probability of x0 (`low_confidence`) or a uniform number (`random`), and commits the top-k. Committed tokens
never change. Ties in confidence go to the lower position, so every backend and the C core agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from seer_deploy.errors import ConfigError
from seer_deploy.models.llada import MaskPredictor

Remasking = Literal["low_confidence", "random"]


@dataclass(frozen=True)
class GenerationConfig:
    gen_length: int = 128
    steps: int = 128
    block_length: int | None = None  # None: one block of gen_length
    temperature: float = 0.0
    remasking: Remasking = "low_confidence"
    cfg_scale: float = 0.0

    @property
    def block(self) -> int:
        return self.block_length or self.gen_length

    def validate(self, max_seq_len: int | None = None, prompt_len: int = 0) -> None:
        """Raise ConfigError naming the bad setting and a fix."""
        if self.gen_length < 1 or self.steps < 1:
            raise ConfigError(f"gen_length ({self.gen_length}) and steps ({self.steps}) must be positive")
        if self.block < 1 or self.gen_length % self.block:
            raise ConfigError(
                f"gen_length {self.gen_length} is not a multiple of block_length {self.block}; "
                f"choose a block_length that divides gen_length"
            )
        n_blocks = self.gen_length // self.block
        if self.steps % n_blocks:
            raise ConfigError(
                f"steps {self.steps} cannot be split evenly across {n_blocks} blocks; use a multiple of {n_blocks}"
            )
        if self.remasking not in ("low_confidence", "random"):
            raise ConfigError(f"remasking '{self.remasking}' is unknown; use 'low_confidence' or 'random'")
        if self.temperature < 0 or self.cfg_scale < 0:
            raise ConfigError("temperature and cfg_scale must be >= 0")
        if max_seq_len is not None and prompt_len + self.gen_length > max_seq_len:
            raise ConfigError(
                f"prompt ({prompt_len} tokens) + gen_length ({self.gen_length}) = {prompt_len + self.gen_length} "
                f"exceeds the model's {max_seq_len} positions; shorten the prompt or lower --gen-length"
            )


def transfer_schedule(n_masked: int, steps: int) -> list[int]:
    """How many tokens each of `steps` steps commits: an even split of n_masked, the remainder to the first steps."""
    base, rem = divmod(n_masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Left-padded ids [B, P] and attention mask [B, P] (1 = real token)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt must have at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def gumbel_argmax(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """x0 = argmax(logits) at temperature 0, else LLaDA's Gumbel-max in float64: exp(l) / (-log u)^T."""
    if temperature == 0:
        return logits.argmax(-1)
    logits64 = logits.to(torch.float64)
    noise = torch.rand(logits64.shape, dtype=torch.float64, generator=generator, device=logits.device)
    return (logits64.exp() / (-torch.log(noise)) ** temperature).argmax(-1)


def select_transfer(confidence: Tensor, k: Tensor) -> Tensor:
    """Boolean [B, L]: per row the k[b] highest confidences; ties go to the lower position (stable sort)."""
    order = torch.sort(confidence, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return ranks < k[:, None]


@dataclass
class GenerationResult:
    tokens: Tensor  # [B, gen_length] response ids
    steps_run: int  # forward passes of the loop
    tokens_processed: int  # sum over forward passes of the real (non-padding) tokens they ran
    extras: dict[str, object] = field(default_factory=dict)


@torch.no_grad()
def generate(
    model: MaskPredictor,
    prompts: list[list[int]],
    config: GenerationConfig,
    *,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Fill `gen_length` masked positions after each prompt; prompts of different length are left-padded."""
    cfg = model.cfg
    config.validate(cfg.max_seq_len, max(len(p) for p in prompts))
    device = next(model.parameters()).device
    pad_id = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    B, P = prompt_ids.shape
    G, block = config.gen_length, config.block
    x = torch.full((B, P + G), cfg.mask_id, dtype=torch.long, device=device)
    x[:, :P] = prompt_ids.to(device)
    attn = torch.cat([prompt_mask, torch.ones(B, G, dtype=torch.long)], dim=1).to(device)
    attention_mask = None if bool(attn.all()) else attn
    is_prompt = torch.zeros_like(x, dtype=torch.bool)
    is_prompt[:, :P] = prompt_mask.bool().to(device)
    steps_per_block = config.steps // (G // block)
    steps_run = tokens_processed = 0
    real_tokens = int(attn.sum())
    for b in range(G // block):
        lo, hi = P + b * block, P + (b + 1) * block
        n_masked = (x[:, lo:hi] == cfg.mask_id).sum(-1).tolist()
        schedules = torch.tensor([transfer_schedule(n, steps_per_block) for n in n_masked], device=device)
        for i in range(steps_per_block):
            is_masked = x == cfg.mask_id
            logits = _logits(model, x, attention_mask, is_prompt, config.cfg_scale, cfg.mask_id)
            x0 = gumbel_argmax(logits, config.temperature, generator)
            if config.remasking == "low_confidence":
                probs = F.softmax(logits.float(), dim=-1)
                score = probs.gather(-1, x0[..., None]).squeeze(-1)
            else:
                score = torch.rand(x.shape, generator=generator, device=device)
            score[:, hi:] = -torch.inf
            confidence = torch.where(is_masked, score, torch.full_like(score, -torch.inf))
            commit = select_transfer(confidence, schedules[:, i]) & is_masked
            x = torch.where(commit, x0, x)
            steps_run += 1
            tokens_processed += real_tokens * (2 if config.cfg_scale > 0 else 1)
    return GenerationResult(tokens=x[:, P:].cpu(), steps_run=steps_run, tokens_processed=tokens_processed)


def _logits(
    model: MaskPredictor, x: Tensor, attention_mask: Tensor | None, is_prompt: Tensor, cfg_scale: float, mask_id: int
) -> Tensor:
    if cfg_scale == 0:
        return model(x, attention_mask).logits
    # Classifier-free guidance: a second copy with the prompt masked gives the unconditional logits.
    uncond = torch.where(is_prompt, torch.full_like(x, mask_id), x)
    mask2 = None if attention_mask is None else torch.cat([attention_mask, attention_mask])
    cond_logits, uncond_logits = model(torch.cat([x, uncond]), mask2).logits.chunk(2)
    return uncond_logits + (cfg_scale + 1) * (cond_logits - uncond_logits)
