"""The runtime denoising loop: `reference.generate`'s semantics in numpy, driving any `Backend`.

One path for every request: step zero at full length (its commits count, and its `Step0Output` is what Seer
reads) -> a plan per row (`seer.plan`: Seer's cut, forced kept lengths, or full length) -> the batch scheduler's
groups (`runtime.scheduler`) -> the one executor (`runtime.executor`) for the steps that remain. Engine calls stay
in Python; the per-step host work (schedule, top-k commit, stop test) runs in the C core or its numpy twin, which
give the same results.

As in LLaDA (and the reference loop), the candidates of a step are all masked positions before the end of the
current block: masks inside the prompt (infilling) or left in an earlier block stay candidates. A step that cannot
commit anything in any row is not run; the tokens are the same as the reference's, which runs it anyway, and
`passes` counts the forward passes made.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import numpy as np

from seer_deploy.core.backend import (
    StepInput,
    kv_zeros,
    supports_cache,
    supports_guidance,
    supports_prompt_cache,
    window_lead,
)
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds, left_pad
from seer_deploy.runtime.executor import LoopContext, Rows, Tally, mask_columns, run_group
from seer_deploy.runtime.loopcore import LoopCore, active_core
from seer_deploy.runtime.rule_loop import run_rule_group
from seer_deploy.runtime.rules import StepCount, pass_count
from seer_deploy.runtime.scheduler import HybridPlan, StepCost, plan_hybrid, step_cost_of
from seer_deploy.runtime.settled import SettledHook
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.plan import SeerReport, TruncationPlan, full_length_plan, make_plan, plan_batch

if TYPE_CHECKING:  # annotations only
    from seer_deploy.core.backend import Backend, CacheBackend, KVCache, PassOutput, PromptCacheBackend, Step0Output


@dataclass
class LoopResult:
    tokens: np.ndarray  # int64 [B, gen_length] response ids; the cut tails hold EOS
    passes: int  # forward passes made
    tokens_processed: int  # sum over forward passes of the real (non-padding) tokens they ran
    seer: list[SeerReport] | None = None  # per request, when Seer (or forced kept lengths) truncated the loop
    hybrid: HybridPlan | None = None  # the groups the later steps ran in
    positions_computed: int = 0  # all positions over the passes, padding included
    batch_sizes: list[int] = field(default_factory=list)  # rows per forward pass, step zero first
    row_passes: list[int] = field(default_factory=list)  # forward passes each request made, step zero included
    step_zero_seconds: float = 0.0  # wall time of step zero (what Seer cannot cut)
    step_zero_done_at: float = 0.0  # time.perf_counter() when step zero ended: where time to first step stops


@dataclass(frozen=True)
class LoopOptions:
    """How the loop runs, beside what it computes: the host core (default: the C core if built, else the numpy
    twin), the scheduler's step cost model (default: the backend's own, `scheduler.step_cost_of`), and a hook told,
    after the pass that grew it, row b's settled response prefix (the ids before its first mask, which no later step
    changes: what a server streams; not called during step zero)."""

    core: LoopCore | None = None
    cost: StepCost | None = None
    on_settled: SettledHook | None = None


def guidance_refusal(cfg_scale: float, backend_name: str) -> ConfigError:
    """The one refusal of classifier-free guidance where the graphs return no logits."""
    return ConfigError(
        f"cfg_scale {cfg_scale} (classifier-free guidance) mixes two full logit tensors, which only the torch backend "
        f"has; '{backend_name}' returns just the chosen token and its probability: run the checkpoint itself "
        f"(torch), or set cfg_scale to 0"
    )


def check_supported(config: GenerationConfig, backend: Backend) -> None:
    """ConfigError for settings this backend cannot run."""
    if config.cfg_scale > 0 and not supports_guidance(backend):
        raise guidance_refusal(config.cfg_scale, backend.name)
    scoring = config.scoring()
    if scoring is not None and scoring.filtered and not supports_guidance(backend):
        raise ConfigError(
            f"--top-p / --top-k filter the whole vocabulary before the softmax, which only the torch backend has; "
            f"'{backend.name}' returns the chosen token and its score: run the checkpoint itself (torch), or drop "
            "--top-p / --top-k"
        )
    caches = (("--kv-cache", config.kv_cache, supports_cache(backend), "the cache graphs (refresh, window_step)"),
              ("--prompt-cache", config.prompt_cache, supports_prompt_cache(backend),
               "the prompt-cache graph (prompt_step)"))
    for flag, wanted, supported, graphs in caches:
        if wanted and not supported:
            raise ConfigError(f"{flag} needs {graphs}, which '{backend.name}' does not have; re-export with "
                              f"`seer-deploy export --kv-cache` (and rebuild), or drop {flag}")


def check_prompts(prompts: Sequence[Sequence[int]], config: GenerationConfig, backend: Backend, mask_id: int,
                  picture_id: int | None = None) -> None:
    """ConfigError for prompts these settings cannot run: with the prompt cache, a prompt holding the mask token; with
    a cache whose passes run the last prompt token (the prompt cache; a shifted model's first window), a prompt that
    ends with a picture (`picture_id`, its placeholder): the cached graphs take no image table (and an M-RoPE model's
    cached positions hold for text after its pictures only)."""
    if config.prompt_cache and any(mask_id in p for p in prompts):
        raise ConfigError("a prompt holds the mask token: the prompt cache keeps the prompt as step zero left it, "
                          "so its masks would never be filled; drop --prompt-cache or the masks from the prompt")
    runs_last = config.prompt_cache or (config.kv_cache and window_lead(backend) > 0)
    if runs_last and picture_id is not None and any(p and p[-1] == picture_id for p in prompts):
        raise ConfigError("a prompt ends with a picture: the cache's passes run the last prompt token, which must be "
                          "text; put the question after the picture (a chat template's assistant header does) or drop "
                          "the cache")


def run_generation(
    backend: Backend,
    prompts: list[list[int]],
    config: GenerationConfig,
    ids: SpecialIds,
    *,
    seed: int = 0,
    seer: SeerConfig | None = None,
    kept_lengths: Sequence[int] | None = None,
    options: LoopOptions = LoopOptions(),
) -> LoopResult:
    """Fill `gen_length` masked positions after each prompt with `backend`; the tokens of `reference.generate`.

    The prompts and settings were checked once by whoever prepared them (`Service.prepare`: the prompts fit the
    model's positions, the backend runs the settings); this loop does not check them again. seed: the host RNG for
    random remasking scores and the backend's sampling seeds at temperature > 0. seer: truncate each response after
    step zero as `seer_deploy.seer.plan` decides, with the config's tail context; kept_lengths forces the kept lengths
    instead (oracle runs). ids.eos is what the cut tail holds and what the EOS detector looks for.
    """
    mask_id, pad_id, eos = ids.mask, ids.pad, ids.eos
    cost, on_settled = options.cost, options.on_settled
    ctx = LoopContext(backend, options.core or active_core(), config, mask_id, pad_id, eos,
                      np.random.default_rng(seed), seer, on_settled)
    tally = Tally()
    B, G = len(prompts), config.gen_length
    padded, real = left_pad(prompts, pad_id)
    P = padded.shape[1]
    x = np.concatenate([padded, np.full((B, G), mask_id, dtype=np.int64)], axis=1)
    real = np.concatenate([real, np.ones((B, G), dtype=np.int64)], axis=1)
    mask = None if bool(real.all()) else real
    first = full_length_plan(G, config.steps, config.block_length).blocks[0]
    left = ctx.core.masks_left(x, np.full(B, P + first.start, np.int64), np.full(B, P + first.end, np.int64), mask_id)
    schedule = ctx.core.transfer_schedule(left, first.steps)
    prompt_masks = np.array([sum(t == mask_id for t in p) for p in prompts], np.int64)
    zero_counts, zero_lo, zero_hi = None, 0, P + first.end
    if config.first_from_prompt:  # LaViDa-Dream's prompt pass: the first answer token, greedily, and nothing else
        zero_counts, zero_lo, zero_hi = [StepCount(1)] * B, P, P + 1
    elif config.dream_sampler:  # every mask of the sequence is a candidate, the prompt's too
        zero_counts = [pass_count(ctx.core, config, int(m), int(m), 0, config.steps) for m in left + prompt_masks]
    truncating = seer is not None or kept_lengths is not None
    started = time.perf_counter()
    # The progressive step zero (a short canvas first) counts LLaDA's schedule; the Dream family's sampler runs
    # step zero at full length.
    canvas = seer.first_canvas if seer is not None and kept_lengths is None and zero_counts is None else 0
    plans: list[TruncationPlan | None] = [None] * B
    prompt_kv = PromptKV(config.prompt_cache, B, P)
    if 0 < canvas < G:  # progressive step zero: a short canvas first
        plans = first_canvas_plans(ctx, Canvas(x, mask, real, P), first.end, schedule[:, 0], canvas, tally, prompt_kv)
    todo = [b for b in range(B) if plans[b] is None]  # rows that run step zero at full length
    out0, kv = None, None
    if todo:
        x_zero = x[todo]  # a copy: step zero commits into it
        mask_zero = None if mask is None or bool(mask[todo].all()) else np.ascontiguousarray(mask[todo])
        out0, kv = step_zero(ctx, Canvas(x_zero, mask_zero, real[todo], P), zero_hi, schedule[todo, 0], tally,
                             truncating, None if zero_counts is None else [zero_counts[b] for b in todo], zero_lo)
        x[todo] = x_zero
        prompt_kv.keep(todo, kv)
    step_zero_done_at = time.perf_counter()
    step_zero_seconds = step_zero_done_at - started
    responses = x[:, P:].copy()
    # The prompts as step zero left them: masks inside a prompt are candidates too, and its commits stand.
    prompts = [x[b, P - len(p) : P].tolist() for b, p in enumerate(prompts)]
    if out0 is not None and truncating:
        kept = None if kept_lengths is None else [kept_lengths[b] for b in todo]
        full = plan_batch(out0, list(backend.sparsity_rows), P, x_zero[:, P:], config, ids, seer=seer,
                          kept_lengths=kept)
        for b, plan in zip(todo, full, strict=True):
            plans[b] = plan
    elif not truncating:
        plans = [full_length_plan(G, config.steps, config.block_length)] * B
    if not all(plan is not None for plan in plans):
        raise AssertionError("every row has a plan after step zero")
    decided = [plan for plan in plans if plan is not None]
    rows = Rows(prompts, responses, decided, None if truncating else schedule[:, 1:],
                prompt_kv.kv if config.prompt_cache else kv, prompt_masks)
    tokens, hybrid, passes = run_rows(ctx, rows, tally, cost)
    row_passes = [1 + int(n) for n in passes]
    reports = None
    if truncating:
        forced = kept_lengths is not None
        counted = config.passes_follow_model or config.prompt_cache
        reports = [SeerReport.from_plan(plan, len(prompts[b]), ctx.passes_per_step, forced=forced,
                                        passes=row_passes[b] if counted else None,
                                        cached=len(prompts[b]) - 1 if config.prompt_cache else 0)
                   for b, plan in enumerate(decided)]
    return LoopResult(tokens, tally.passes, tally.tokens_processed, reports, hybrid, tally.positions_computed,
                      tally.batch_sizes, row_passes, step_zero_seconds, step_zero_done_at)


def first_canvas_plans(
    ctx: LoopContext,
    rows: Canvas,
    first_end: int,
    k: np.ndarray,
    canvas: int,
    tally: Tally,
    prompt_kv: PromptKV,
) -> list[TruncationPlan | None]:
    """Progressive step zero: step zero on prompt + `canvas` masks for every row of `rows` (at full length). A row
    whose kept length (boundary + margin) falls inside the canvas keeps that step zero's commits, written into
    rows.x, and gets its plan at full gen_length; the others get None (and run step zero at full length).

    On the canvas the model answers as with gen_length = canvas, so the answers are those of a shorter run: keep it
    where the bench shows equal accuracy.
    """
    seer = ctx.seer
    assert seer is not None
    config, P, x, real = ctx.config, rows.prompt_width, rows.x, rows.real
    width = P + canvas
    xc = np.ascontiguousarray(x[:, :width])
    mask = np.ascontiguousarray(real[:, :width])
    out0, kv = step_zero(ctx, Canvas(xc, None if bool(mask.all()) else mask, mask, P), P + min(first_end, canvas), k,
                         tally, truncating=True)
    assert out0 is not None
    on_canvas = plan_batch(out0, list(ctx.backend.sparsity_rows), P, xc[:, P:],
                           replace(config, gen_length=canvas, steps=canvas, block_length=None),
                           SpecialIds(ctx.mask_id, ctx.pad_id, ctx.eos_id), seer=seer)
    plans: list[TruncationPlan | None] = []
    for b, plan in enumerate(on_canvas):
        if plan.kept >= canvas:  # no end inside the canvas: step zero again at full length
            plans.append(None)
            continue
        x[b, :width] = xc[b]
        prompt_kv.keep([b], None if kv is None else kv[:, :, b : b + 1])
        plans.append(make_plan(config.gen_length, config.steps, config.block_length, plan.kept,
                               still_masked=x[b, P:] == ctx.mask_id, boundary=plan.boundary,
                               context=seer.context_slots(plan.kept, config.gen_length)))
    return plans


class PromptKV:
    """The prompt cache's keys and values of a batch as step zero leaves them, row by row: the prompt columns of
    step zero's kv (a row planned on the first canvas keeps its canvas pass's)."""

    def __init__(self, wanted: bool, batch: int, prompt_width: int) -> None:
        self.wanted, self.batch, self.prompt_width = wanted, batch, prompt_width
        self.kv: KVCache | None = None

    def keep(self, rows: Sequence[int], kv: KVCache | None) -> None:
        if not self.wanted:
            return
        assert kv is not None, "with the prompt cache, step zero returns the keys and values"
        prompt = kv[:, :, :, :, : self.prompt_width]
        if self.kv is None:
            shape = list(prompt.shape)
            shape[2] = self.batch
            self.kv = kv_zeros(prompt, tuple(shape))
        self.kv[:, :, list(rows)] = prompt


def run_rows(ctx: LoopContext, rows: Rows, tally: Tally, cost: StepCost | None = None
             ) -> tuple[np.ndarray, HybridPlan, np.ndarray]:
    """Every row's steps after step zero, in the groups the scheduler chooses: the responses int64 [B, gen_length]
    (cut tails EOS), the scheduler's plan and the passes each row made."""
    hybrid = plan_hybrid(rows.plans, [len(p) for p in rows.prompts], cost or step_cost_of(ctx.backend))
    tokens = np.full(rows.responses.shape, ctx.eos_id, dtype=np.int64)
    passes = np.zeros(rows.responses.shape[0], np.int64)
    runner = run_rule_group if ctx.config.dream_sampler else run_group
    for group in hybrid.groups:
        tokens[list(group)], passes[list(group)] = runner(ctx, rows.take(group), tally, list(group))
    return tokens, hybrid, passes


def run_planned(
    backend: Backend,
    prompts: Sequence[Sequence[int]],
    config: GenerationConfig,
    plans: Sequence[TruncationPlan],
    ids: SpecialIds,
    core: LoopCore | None = None,
) -> LoopResult:
    """Plans decided before any step runs (oracle studies: each answer's length known up front): every row from all
    masks through the executor, no step zero at full length. A plan's blocks[0].steps counts a step zero, so give
    block 0 one step more than it should run."""
    if config.prompt_cache:
        raise ConfigError("the prompt cache is cut from step zero, which planned runs do not make; drop --prompt-cache")
    ctx = LoopContext(backend, core or active_core(), config, ids.mask, ids.pad, ids.eos, np.random.default_rng(0))
    tally = Tally()
    masks = np.full((len(prompts), config.gen_length), ids.mask, dtype=np.int64)
    tokens, hybrid, passes = run_rows(ctx, Rows(prompts, masks, plans), tally)
    return LoopResult(tokens, tally.passes, tally.tokens_processed, None, hybrid, tally.positions_computed,
                      tally.batch_sizes, [int(n) for n in passes])


@dataclass(frozen=True)
class Canvas:
    """The rows step zero runs on: ids x int64 [B, S] (committed into in place), the attention mask (None: every
    position real), the real positions int64 [B, S] (what a pass is counted by) and the prompts' padded width."""

    x: np.ndarray
    mask: np.ndarray | None
    real: np.ndarray
    prompt_width: int


def step_zero(ctx: LoopContext, canvas: Canvas, hi: int, k: np.ndarray, tally: Tally, truncating: bool,
              counts: list[StepCount] | None = None, lo: int = 0) -> tuple[Step0Output | None, KVCache | None]:
    """The first denoising step, at full length: commits k[b] masks (or, with parallel decoding, those the rule
    accepts; under the Dream family's sampler what `counts` ask for) in [lo, hi) of x; returns what Seer reads and,
    when it was a refresh, the keys and values. LaViDa-Dream's prompt pass (first_from_prompt) is always greedy.

    The Backend's step0 is greedy; at temperature > 0 the commit uses a sampled step at the same input (one more
    forward pass, counted) so the loop samples from its first step on. A run that does not truncate needs only that
    step (None is returned: nobody reads step zero's statistics), and with the KV cache it is a refresh: step zero
    fills the first block's cache.
    """
    x, mask, real, prompt_width = canvas.x, canvas.mask, canvas.real, canvas.prompt_width
    B = x.shape[0]
    out0, kv = None, None
    config = ctx.config
    greedy = config.temperature == 0 or config.first_from_prompt
    cached = config.kv_cache or config.prompt_cache
    if truncating or (greedy and not cached) or (config.prompt_cache and config.first_from_prompt):
        # Seer reads step zero's tokens and EOS probabilities over the whole response: every mask is a candidate.
        inputs = StepInput(x, mask, prompt_width=prompt_width, guidance=config.cfg_scale,
                           candidates=mask_columns(x, None, ctx.mask_id), scoring=config.scoring())
        if config.prompt_cache:  # step zero fills the prompt cache
            out0 = cast("PromptCacheBackend", ctx.backend).prefill(inputs)
            kv = out0.kv
        else:
            out0 = ctx.backend.step0(inputs)
        tally.count(ctx, real)
    committed: PassOutput | None = out0
    if out0 is None and cached:  # one pass that also returns the keys and values
        committed = cast("CacheBackend", ctx.backend).refresh(ctx.step_input(x, mask, prompt_width, np.full(B, hi)))
        kv = committed.kv
        tally.count(ctx, real)
    elif not greedy:
        committed = ctx.backend.step(ctx.step_input(x, mask, prompt_width, np.full(B, hi)))
        tally.count(ctx, real)
    assert committed is not None  # greedy runs commit step zero's own tokens
    ctx.commit(x, committed, np.full(B, lo, np.int64), np.full(B, hi, np.int64), k, counts)
    return out0, kv
