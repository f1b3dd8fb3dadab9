"""The reference denoising loop: LLaDA's `generate` semantics in torch eager.

Every other backend is compared with this loop. Semantics (LLaDA): the response is `gen_length` masks split into
blocks of `block_length`; `steps` are split evenly across blocks; inside a block the masked positions are committed
over its steps by an even split (the remainder goes to the first steps). Each step runs the whole sequence, picks
x0 = argmax (Gumbel-max in float64 when temperature > 0), scores masked positions of the current block by the
softmax probability of x0 (`low_confidence`; ranked as its log-probability, which orders the same but does not
saturate near 1.0 in float32, see `models.networks.confidence`) or a uniform number (`random`), and commits the top-k.
Committed tokens never change. Ties in confidence go to the lower position, so every backend and the C core agree
exactly.

Parallel decoding (`config.decode` threshold / factor, Fast-dLLM's rules): each row commits, in its current block,
the ranked candidates that clear `config.rank_thresholds` (at least one) and moves to its next block as soon as its
block has no masks left; rows that are done stay in the batch and commit nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from seer_deploy.core.backend import Step0Output
from seer_deploy.core.generation import GenerationConfig, SpecialIds, left_pad
from seer_deploy.core.sparsity import SparsityRow, StatsSpec, layer_major_rows
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.confidence import greedy_head, log_prob_of, token_log_prob
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.loopcore import transfer_schedule
from seer_deploy.runtime.reference_logits import guided_logits, prefix_width
from seer_deploy.runtime.reference_rules import pass_counts, pick_scored, rule_commit
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.plan import SeerReport, group_rows, plan_batch


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


def select_confident(confidence: Tensor, candidate: Tensor, thresholds: Tensor) -> Tensor:
    """Boolean [B, L]: per row the longest run of its ranked candidates (confidence descending, NaN first, ties to
    the lower position) whose r-th confidence >= thresholds[r] for r >= 1; rank 0 always (if there is one)."""
    order = torch.sort(confidence, dim=-1, descending=True, stable=True).indices
    order = order.gather(-1, torch.sort(candidate.gather(-1, order).int(), dim=-1, descending=True, stable=True).indices)
    ranked, is_candidate = confidence.gather(-1, order), candidate.gather(-1, order)
    ranks = torch.arange(order.shape[-1], device=order.device)
    limit = torch.full((order.shape[-1],), torch.inf, device=order.device)
    n = min(order.shape[-1], thresholds.shape[0])
    limit[:n] = thresholds[:n].to(limit.device)
    passes = ((ranked >= limit) | (ranks == 0)) & is_candidate
    take = torch.cumprod(passes.int(), dim=-1).bool()
    chosen = torch.zeros_like(candidate)
    chosen.scatter_(-1, order, take)
    return chosen


@dataclass
class GenerationResult:
    tokens: Tensor  # [B, gen_length] response ids
    passes: int  # forward passes of the loop
    tokens_processed: int  # sum over forward passes of the real (non-padding) tokens they ran
    seer: list[SeerReport] | None = None  # per request, when Seer (or a forced kept length) truncated the loop


@dataclass
class _Batch:
    """The loop's state: the sequence, its attention mask and which positions hold the prompt."""

    x: Tensor  # [B, P + L]
    attention_mask: Tensor | None
    is_prompt: Tensor
    prompt_width: int
    real_tokens: int
    prompt_kv: Tensor | None = None  # the prompt cache: step zero's keys and values of columns [0, P - 1)

    def pass_tokens(self, config: GenerationConfig) -> int:
        """Real positions a pass after step zero runs: with the prompt cache, from the last prompt token on."""
        if not config.prompt_cache:
            return self.real_tokens
        mask = self.attention_mask
        return int(self.x[:, self.prompt_width - 1 :].numel() if mask is None else mask[:, self.prompt_width - 1 :].sum())


def _start(prompts: list[list[int]], responses: Tensor, cfg: ModelConfig, device: torch.device) -> _Batch:
    """Left-pad the prompts and append the response slots (masks, or step zero's commits)."""
    pad_id = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    ids, mask = left_pad(prompts, pad_id)
    prompt_ids, prompt_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    B, P = prompt_ids.shape
    L = responses.shape[1]
    x = torch.cat([prompt_ids, responses.cpu()], dim=1).to(device)
    attn = torch.cat([prompt_mask, torch.ones(B, L, dtype=torch.long)], dim=1).to(device)
    is_prompt = torch.zeros_like(x, dtype=torch.bool)
    is_prompt[:, :P] = prompt_mask.bool().to(device)
    return _Batch(x, None if bool(attn.all()) else attn, is_prompt, P, int(attn.sum()))


class _StepOut(NamedTuple):
    x: Tensor  # the sequence after the commit
    x0: Tensor  # [B, S] chosen token per position
    logits: Tensor
    stats: Tensor | None


def _step(
    model: MaskPredictor,
    batch: _Batch,
    hi: Tensor,
    k: Tensor | None,
    config: GenerationConfig,
    generator: torch.Generator | None,
    spec: StatsSpec | None = None,
    rule: tuple[int, int, Tensor] | None = None,
) -> _StepOut:
    """One denoising step: forward, x0, score the masked positions before hi[b], commit the top k[b] of row b (or,
    k None, the ones parallel decoding's rule accepts; under the Dream family's sampler, `rule` = (pass index,
    passes, masks at the start per row): what that pass of the rule commits)."""
    mask_id = model.cfg.mask_id
    x = batch.x
    is_masked = x == mask_id
    logits, stats = _logits(model, batch, config, spec)
    scoring = config.scoring()
    if scoring is not None and rule is not None:
        x0, score = pick_scored(logits, config.temperature, generator, scoring)
        candidate = is_masked & (torch.arange(x.shape[1], device=x.device)[None, :] < hi[:, None])
        return _StepOut(rule_commit(x, x0, score, candidate, rule, config, generator), x0, logits, stats)
    x0 = gumbel_argmax(logits, config.temperature, generator)
    if config.remasking == "low_confidence":
        score = token_log_prob(logits, x0)
    else:
        score = torch.rand(x.shape, generator=generator, device=x.device)
    before = torch.arange(x.shape[1], device=x.device)[None, :] < hi[:, None]
    if k is None:
        thresholds = torch.from_numpy(config.rank_thresholds(x.shape[1]))
        commit = select_confident(score, is_masked & before, thresholds)
    else:
        score = torch.where(before, score, torch.full_like(score, -torch.inf))
        confidence = torch.where(is_masked, score, torch.full_like(score, -torch.inf))
        commit = select_transfer(confidence, k) & is_masked
    return _StepOut(torch.where(commit, x0, x), x0, logits, stats)


def _logits(model: MaskPredictor, batch: _Batch, config: GenerationConfig, spec: StatsSpec | None
            ) -> tuple[Tensor, Tensor | None]:
    """A pass's logits [B, S, V] (and with `spec` its statistics). With the prompt cache the first pass (step zero)
    keeps its keys and values of the columns before the last prompt token, and every later one runs the last prompt
    token and the response against them (the prompt columns' logits are zeros: they hold no mask)."""
    if not config.prompt_cache:
        return guided_logits(model, batch.x, batch.attention_mask, batch.is_prompt, config.cfg_scale,
                             model.cfg.mask_id, spec, batch.prompt_width)
    x, P = batch.x, batch.prompt_width
    width = prefix_width(model, x.shape[0], P, x.device)
    if batch.prompt_kv is None:
        out = model(x, batch.attention_mask, stats=spec, return_kv=True, **width)
        assert out.kv is not None
        batch.prompt_kv = out.kv[:, :, :, :, : P - 1]
        return out.logits, out.stats
    mask = torch.ones_like(x) if batch.attention_mask is None else batch.attention_mask
    start = torch.full((x.shape[0],), P - 1, device=x.device)
    hidden = model.cached_hidden(x[:, P - 1 :], mask, start, batch.prompt_kv, width.get("prompt_width"))
    run = model.shifted(model.logits_of(hidden), dim=1)
    return torch.cat([run.new_zeros(run.shape[0], P - 1, run.shape[2]), run], dim=1), None


def _run_block(
    model: MaskPredictor,
    batch: _Batch,
    lo: int,
    hi: int,
    n_steps: int,
    config: GenerationConfig,
    generator: torch.Generator | None,
) -> int:
    """Run `n_steps` steps on the block [lo, hi) of batch.x in place; the schedule splits its masks evenly."""
    if n_steps == 0:
        return 0
    n_masked = (batch.x[:, lo:hi] == model.cfg.mask_id).sum(-1).tolist()
    schedules = torch.from_numpy(transfer_schedule(np.array(n_masked, np.int64), n_steps)).to(batch.x.device)
    row_hi = torch.full((batch.x.shape[0],), hi, device=batch.x.device)
    for i in range(n_steps):
        batch.x = _step(model, batch, row_hi, schedules[:, i], config, generator).x
    return n_steps


def _prompt_pass(model: MaskPredictor, batch: _Batch, config: GenerationConfig, spec: StatsSpec | None = None
                 ) -> _StepOut:
    """LaViDa-Dream's prompt pass: the first answer token, greedily, and nothing else (config.first_from_prompt)."""
    mask_id, P = model.cfg.mask_id, batch.prompt_width
    logits, stats = _logits(model, batch, config, spec)
    x0 = logits.argmax(-1)
    x = batch.x.clone()
    x[:, P] = torch.where(x[:, P] == mask_id, x0[:, P], x[:, P])
    return _StepOut(x, x0, logits, stats)


def _run_rule(model: MaskPredictor, batch: _Batch, hi: int, first: int, steps: int, totals: Tensor,
              config: GenerationConfig, generator: torch.Generator | None) -> int:
    """Passes first..steps-1 of the Dream family's sampler over the columns before hi; a pass that would commit
    nothing in any row is not run (the loop so ends when no mask is left). Returns the passes made."""
    row_hi = torch.full((batch.x.shape[0],), hi, device=batch.x.device)
    ran = 0
    for i in range(first, steps):
        counts, _, _ = pass_counts(_masks_before(batch.x, row_hi, model.cfg.mask_id), totals, i, steps, config)
        if any(c > 0 for c in counts):
            batch.x = _step(model, batch, row_hi, None, config, generator, rule=(i, steps, totals)).x
            ran += 1
    return ran


def _run_parallel(
    model: MaskPredictor,
    batch: _Batch,
    blocks: Sequence[tuple[int, int]],
    config: GenerationConfig,
    generator: torch.Generator | None,
) -> tuple[int, list[int]]:
    """Parallel decoding over `blocks` (sequence columns [lo, hi)): every row works in its first block that still has
    masks (or until a pass changes none of its candidates); the loop ends when no row has a block left. Returns the forward passes made and, per row, those it was not done
    in (what it costs alone)."""
    mask_id, device = model.cfg.mask_id, batch.x.device
    B, n = batch.x.shape[0], len(blocks)
    current = [0] * B
    passes, row_passes = 0, [0] * B
    while True:
        for b in range(B):  # a row moves on as soon as its block has no masks left
            while current[b] < n and not bool((batch.x[b, slice(*blocks[current[b]])] == mask_id).any()):
                current[b] += 1
        if all(j == n for j in current):
            return passes, row_passes
        hi = torch.tensor([blocks[j][1] if j < n else 0 for j in current], device=device)
        before = _masks_before(batch.x, hi, mask_id)
        batch.x = _step(model, batch, hi, None, config, generator).x
        stuck = (_masks_before(batch.x, hi, mask_id) == before).tolist()
        passes += 1
        row_passes = [r + (j < n) for r, j in zip(row_passes, current, strict=True)]
        # A pass that changed no mask (the model proposed the mask token itself) ends the block: it would repeat.
        current = [j + 1 if j < n and still else j for j, still in zip(current, stuck, strict=True)]


def _masks_before(x: Tensor, hi: Tensor, mask_id: int) -> Tensor:
    """[B]: masked positions before hi[b] in each row."""
    return ((x == mask_id) & (torch.arange(x.shape[1], device=x.device)[None, :] < hi[:, None])).sum(-1)


@torch.no_grad()
def generate(
    model: MaskPredictor,
    prompts: list[list[int]],
    config: GenerationConfig,
    *,
    generator: torch.Generator | None = None,
    seer: SeerConfig | None = None,
    kept_lengths: Sequence[int] | None = None,
) -> GenerationResult:
    """Fill `gen_length` masked positions after each prompt; prompts of different length are left-padded.

    seer: detect each answer's end at step zero and run the later steps on prompt + kept length only, plus the
    config's tail context (the cut slots the later steps still see as committed EOS; 0 is the paper's cut, 'all' the
    whole tail; see `seer_deploy.seer.plan`). kept_lengths: force the kept length per request instead (oracle
    studies; the tail context is still the seer config's, 0 without one).
    """
    cfg = model.cfg
    config.check_fits(cfg.max_seq_len, max(len(p) for p in prompts))
    if seer is not None or kept_lengths is not None:
        return _generate_seer(model, prompts, config, generator, seer, kept_lengths)
    device = next(model.parameters()).device
    G, block = config.gen_length, config.block
    batch = _start(prompts, torch.full((len(prompts), G), cfg.mask_id, dtype=torch.long), cfg, device)
    P = batch.prompt_width
    steps_per_block = config.steps_per_block
    n_passes = 0
    if config.dream_sampler:
        steps, prompt_pass = config.steps, 0
        if config.first_from_prompt:  # LaViDa-Dream: the prompt pass, then min(steps, G) passes
            batch.x, steps, prompt_pass = _prompt_pass(model, batch, config).x, min(steps, G), 1
        totals = _masks_before(batch.x, torch.full((len(prompts),), P + G, device=device), cfg.mask_id)
        n_passes = prompt_pass + _run_rule(model, batch, P + G, 0, steps, totals, config, generator)
    elif config.parallel:
        n_passes = _run_parallel(model, batch, [(P + s, P + s + block) for s in range(0, G, block)], config,
                                  generator)[0]
    for b in range(0 if config.parallel or config.dream_sampler else G // block):
        n_passes += _run_block(model, batch, P + b * block, P + (b + 1) * block, steps_per_block, config, generator)
    passes = 2 if config.cfg_scale > 0 else 1
    tokens_processed = (batch.real_tokens + (n_passes - 1) * batch.pass_tokens(config)) * passes
    return GenerationResult(
        tokens=batch.x[:, P:].cpu(), passes=n_passes, tokens_processed=tokens_processed)


def _generate_seer(
    model: MaskPredictor,
    prompts: list[list[int]],
    config: GenerationConfig,
    generator: torch.Generator | None,
    seer: SeerConfig | None,
    kept_lengths: Sequence[int] | None,
) -> GenerationResult:
    """Step zero at full length for the whole batch, then each group of equal plans on its own kept length (plus
    `tail_context` committed EOS slots)."""
    cfg = model.cfg
    device = next(model.parameters()).device
    B, G, block = len(prompts), config.gen_length, config.block
    batch = _start(prompts, torch.full((B, G), cfg.mask_id, dtype=torch.long), cfg, device)
    P = batch.prompt_width
    steps_per_block = config.steps_per_block
    spec = seer.stats_spec(cfg.n_layers) if seer is not None and seer.needs_sparsity else None
    first = None if config.parallel else torch.tensor([int(transfer_schedule(np.array([block]), steps_per_block)[0, 0])] * B, device=device)
    prompt_masks = torch.tensor([sum(t == cfg.mask_id for t in p) for p in prompts])
    rule = (0, config.steps, prompt_masks + G) if config.dream_sampler else None
    zero = _prompt_pass(model, batch, config, spec) if config.first_from_prompt else _step(
        model, batch, torch.full((B,), P + block, device=device), first, config, generator, spec, rule)
    passes = 2 if config.cfg_scale > 0 else 1
    tokens_processed = batch.real_tokens * passes
    responses = zero.x[:, P:].cpu()
    # The prompts as step zero left them: masks inside a prompt are candidates too, and its commits stand.
    after_zero = [zero.x[b, P - len(p) : P].tolist() for b, p in enumerate(prompts)]
    step0, rows = _step0_output(zero, cfg.eos_id, spec)
    plans = plan_batch(step0, rows, P, responses.numpy(), config, SpecialIds(cfg.mask_id, cfg.eos_id), seer=seer,
                       kept_lengths=kept_lengths)
    # Rows with the same plan run together: padded to the group's longest prompt, the padding masked out.
    tokens = torch.full((B, G), cfg.eos_id, dtype=torch.long)
    n_passes = 1
    per_row_passes: dict[int, int] = {}  # parallel decoding: the passes each row's group made, step zero included
    for blocks, rows_of_group in group_rows(plans):
        kept = blocks[-1].end
        context = plans[rows_of_group[0]].context
        slots = responses[rows_of_group, : kept + context].clone()
        slots[:, kept:] = cfg.eos_id  # the context: committed EOS, past every block, so never scored or changed
        sub = _start([after_zero[b] for b in rows_of_group], slots, cfg, device)
        Pg = sub.prompt_width
        if batch.prompt_kv is not None:  # the group's prompt columns are the last Pg of step zero's
            sub.prompt_kv = batch.prompt_kv[:, :, rows_of_group, :, P - Pg :]
        if config.dream_sampler:
            lead = 1 if config.first_from_prompt else 0  # after the prompt pass: every pass, the first token set
            ran = _run_rule(model, sub, Pg + kept, 1 - lead, min(blocks[0].steps, kept) if lead else blocks[0].steps,
                            prompt_masks[rows_of_group] + kept - lead, config, generator)
            n_passes += ran
            tokens_processed += ran * sub.pass_tokens(config) * passes
            per_row_passes.update({b: 1 + ran for b in rows_of_group})
        elif config.parallel:
            ran, row_ran = _run_parallel(model, sub, [(Pg + bp.start, Pg + bp.end) for bp in blocks], config,
                                         generator)
            n_passes += ran
            tokens_processed += ran * sub.pass_tokens(config) * passes
            per_row_passes.update({b: 1 + r for b, r in zip(rows_of_group, row_ran, strict=True)})
        for j, bp in enumerate(blocks if not (config.parallel or config.dream_sampler) else ()):
            n_steps = bp.steps - 1 if j == 0 else bp.steps  # step zero was the first block's first step
            ran = _run_block(model, sub, Pg + bp.start, Pg + bp.end, n_steps, config, generator)
            n_passes += ran
            tokens_processed += ran * sub.pass_tokens(config) * passes
        tokens[rows_of_group, :kept] = sub.x[:, Pg : Pg + kept].cpu()
    reports = [
        SeerReport.from_plan(plan, len(prompts[b]), passes, forced=kept_lengths is not None,
                             passes=per_row_passes.get(b))
        for b, plan in enumerate(plans)
    ]
    return GenerationResult(tokens=tokens, passes=n_passes, tokens_processed=tokens_processed, seer=reports)


def _step0_output(zero: _StepOut, eos_id: int, spec: StatsSpec | None) -> tuple[Step0Output, list[SparsityRow]]:
    """Step zero in the backends' numpy form (sparsity rows layer-major) and the labels of its sparsity rows."""
    _, _, top, log_total = greedy_head(zero.logits)
    out = Step0Output(
        token_ids=zero.x0.cpu().numpy().astype(np.int64),
        confidence=log_prob_of(zero.logits, zero.x0, top, log_total).cpu().numpy(),
        eos_prob=torch.exp(zero.logits[..., eos_id].float() - top - log_total).cpu().numpy(),
        sparsity=_flat_stats(zero.stats, zero.x0.shape),
    )
    return out, layer_major_rows(spec.layers) if spec is not None else []


def _flat_stats(stats: Tensor | None, shape: torch.Size) -> np.ndarray:
    """stats [B, L, F, S] -> [B, L*F, S] (layer-major), or an empty [B, 0, S] when none were computed."""
    if stats is None:
        return np.zeros((shape[0], 0, shape[1]), dtype=np.float32)
    B, L, Fn, S = stats.shape
    return stats.reshape(B, L * Fn, S).float().cpu().numpy()
