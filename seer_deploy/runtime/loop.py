"""The runtime denoising loop: `reference.generate`'s semantics in numpy, driving any `Backend`, host logic in the core.

Engine calls stay in Python; the per-step host work (schedule, top-k commit, stop test) runs in the C core or its
numpy twin, which give the same results. The loop is split where Seer cuts in: `step_zero` runs the first
denoising step at full length (its commits count, and its `Step0Output` is what Seer reads); `run_blocks` runs the
remaining steps on whatever sequence the state holds, which after a Seer truncation is prompt + kept length.

As in LLaDA (and the reference loop), the candidates of a step are all masked positions before the end of the
current block: masks inside the prompt (infilling) or left in an earlier block stay candidates. A step that cannot
commit anything in any row (its quota is 0 or no masks are left) is not run; the tokens are the same as the
reference's, which runs it anyway, and `steps_run` counts the forward passes made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from seer_deploy.core.backend import Backend, Step0Output, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.runtime.loopcore import LoopCore, active_core
from seer_deploy.runtime.scheduler import run_hybrid
from seer_deploy.seer.config import SeerConfig, TailContext
from seer_deploy.seer.plan import SeerReport, check_tail_override, plan_batch


@dataclass
class LoopResult:
    tokens: np.ndarray  # int64 [B, gen_length] response ids
    steps_run: int  # forward passes made
    tokens_processed: int  # sum over forward passes of the real (non-padding) tokens they ran
    seer: list[SeerReport] | None = None  # per request, when Seer (or forced kept lengths) truncated the loop


@dataclass
class LoopState:
    """The sequence being denoised: left-padded prompts then response slots, and what the loop has cost so far."""

    x: np.ndarray  # int64 [B, P + L], C-contiguous, updated in place by the commits
    attention_mask: np.ndarray | None  # int64 [B, P + L], 1 = real token; None when no row is padded
    prompt_width: int  # P
    real_tokens: int  # non-padding positions per forward pass
    steps_run: int = 0
    tokens_processed: int = 0

    def count_pass(self) -> None:
        self.steps_run += 1
        self.tokens_processed += self.real_tokens

    @property
    def responses(self) -> np.ndarray:
        return self.x[:, self.prompt_width :]


class BlockSpan(Protocol):
    """A semi-autoregressive block in response coordinates [start, end) and its forward passes (seer.plan.BlockPlan)."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def steps(self) -> int: ...


@dataclass(frozen=True)
class Block:
    start: int
    end: int
    steps: int


@dataclass(frozen=True)
class LoopContext:
    """What every step needs besides the state: the engine, the host core, the settings and the host RNG."""

    backend: Backend
    core: LoopCore
    config: GenerationConfig
    mask_id: int
    rng: np.random.Generator  # random remasking scores and per-step sampling seeds


def full_blocks(config: GenerationConfig) -> tuple[Block, ...]:
    """LLaDA's blocks over the whole response, each with its even share of the steps."""
    n_blocks = config.gen_length // config.block
    per_block = config.steps // n_blocks
    return tuple(Block(i * config.block, (i + 1) * config.block, per_block) for i in range(n_blocks))


def check_supported(config: GenerationConfig, backend: Backend) -> None:
    """ConfigError for settings no compact-output backend can run."""
    if config.cfg_scale > 0:
        raise ConfigError(
            f"cfg_scale {config.cfg_scale} (classifier-free guidance) mixes two full logit tensors, which only the "
            f"torch reference loop has (seer_deploy.runtime.reference.generate, used by `seer-deploy generate`); "
            f"no runtime backend supports it (torch, ONNX Runtime and TensorRT return just the chosen token and its "
            f"probability), and '{backend.name}' is one of them: set cfg_scale to 0"
        )


def start_state(prompts: list[list[int]], responses: np.ndarray, pad_id: int) -> LoopState:
    """Left-pad the prompts and append the response slots (all masks, or a truncated response after step zero)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt must have at least one token")
    if responses.ndim != 2 or responses.shape[0] != len(prompts):
        raise ConfigError(f"responses must be [B={len(prompts)}, L], got shape {responses.shape}")
    B, L = responses.shape
    P = max(len(p) for p in prompts)
    x = np.full((B, P + L), pad_id, dtype=np.int64)
    attention = np.ones((B, P + L), dtype=np.int64)
    for b, prompt in enumerate(prompts):
        x[b, P - len(prompt) : P] = prompt
        attention[b, : P - len(prompt)] = 0
    x[:, P:] = responses
    mask = None if bool(attention.all()) else attention
    return LoopState(x=x, attention_mask=mask, prompt_width=P, real_tokens=int(attention.sum()))


def _compact(out: StepOutput | Step0Output, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The backend's token ids and confidences as the core wants them (int64 / float32, C-contiguous)."""
    if out.token_ids.shape != shape or out.confidence.shape != shape:
        raise ConfigError(
            f"the backend returned token_ids {out.token_ids.shape} and confidence {out.confidence.shape} for an input "
            f"of {shape}; it does not follow the Backend interface"
        )
    return np.ascontiguousarray(out.token_ids, dtype=np.int64), np.ascontiguousarray(out.confidence, dtype=np.float32)


def _commit(ctx: LoopContext, state: LoopState, hi: int, k: np.ndarray, out: StepOutput | Step0Output) -> None:
    """Commit the top k[b] masked positions before `hi` (sequence coordinates) by the configured remasking."""
    x0, confidence = _compact(out, state.x.shape)
    if ctx.config.remasking == "random":
        confidence = ctx.rng.random(state.x.shape, dtype=np.float32)
    B = state.x.shape[0]
    ctx.core.commit_step(
        state.x, x0, confidence, np.zeros(B, np.int64), np.full(B, hi, np.int64), k.astype(np.int64), ctx.mask_id
    )


def _seed(ctx: LoopContext) -> int | None:
    return int(ctx.rng.integers(2**63 - 1)) if ctx.config.temperature > 0 else None


def step_zero(ctx: LoopContext, state: LoopState, hi: int, k: np.ndarray) -> Step0Output:
    """The first denoising step, at full length: commits k[b] masks before `hi`, returns what Seer reads.

    The Backend's step0 is greedy; at temperature > 0 the commit uses a sampled step at the same input (one more
    forward pass, counted) so the loop samples from its first step on.
    """
    out0 = ctx.backend.step0(state.x, state.attention_mask)
    state.count_pass()
    committed: StepOutput | Step0Output = out0
    if ctx.config.temperature > 0:
        committed = ctx.backend.step(state.x, state.attention_mask, ctx.config.temperature, _seed(ctx))
        state.count_pass()
    _commit(ctx, state, hi, k, committed)
    return out0


def run_block(
    ctx: LoopContext, state: LoopState, lo: int, hi: int, steps: int, schedule: np.ndarray | None = None
) -> None:
    """Run `steps` steps for the block [lo, hi) of state.x (sequence coordinates).

    schedule: int64 [B, steps] commits per step; None splits the masks left in the block evenly (LLaDA).
    """
    if steps <= 0:
        return
    B = state.x.shape[0]
    if schedule is None:
        left = ctx.core.masks_left(state.x, np.full(B, lo, np.int64), np.full(B, hi, np.int64), ctx.mask_id)
        schedule = ctx.core.transfer_schedule(left, steps)
    zeros, ends = np.zeros(B, np.int64), np.full(B, hi, np.int64)
    for i in range(steps):
        k = schedule[:, i]
        # The stop test: a step that can commit nothing in any row leaves x as it is, so it is not run.
        if not np.any(np.minimum(k, ctx.core.masks_left(state.x, zeros, ends, ctx.mask_id)) > 0):
            continue
        out = ctx.backend.step(state.x, state.attention_mask, ctx.config.temperature, _seed(ctx))
        state.count_pass()
        _commit(ctx, state, hi, k, out)


def run_blocks(
    ctx: LoopContext,
    state: LoopState,
    blocks: Sequence[BlockSpan],
    *,
    first_schedule: np.ndarray | None = None,
) -> None:
    """The steps after step zero on the sequence the state holds (blocks in response coordinates).

    blocks[0].steps includes step zero, which has run. first_schedule: the rest of block 0's schedule (int64
    [B, blocks[0].steps - 1]) when it was fixed before step zero, as at full length; None recomputes it from the
    masks left, as after a truncation.
    """
    P = state.prompt_width
    for j, block in enumerate(blocks):
        steps = block.steps - 1 if j == 0 else block.steps
        schedule = first_schedule if j == 0 else None
        if schedule is not None and schedule.shape != (state.x.shape[0], steps):
            raise ConfigError(f"first_schedule has shape {schedule.shape}, expected {(state.x.shape[0], steps)}")
        run_block(ctx, state, P + block.start, P + block.end, steps, schedule)


def run_generation(
    backend: Backend,
    prompts: list[list[int]],
    config: GenerationConfig,
    *,
    mask_id: int,
    pad_id: int,
    core: LoopCore | None = None,
    seed: int = 0,
    seer: SeerConfig | None = None,
    kept_lengths: Sequence[int] | None = None,
    eos_id: int | None = None,
    tail_context: TailContext | None = None,
) -> LoopResult:
    """Fill `gen_length` masked positions after each prompt with `backend`; the tokens of `reference.generate`.

    core: the host core (default: the C core if built, else the numpy twin). seed: the host RNG for random
    remasking scores and the backend's sampling seeds at temperature > 0. seer: truncate each response after step
    zero as `seer_deploy.seer.plan` decides (kept_lengths forces the kept lengths instead, for oracle runs); eos_id
    (default: pad_id) is what the cut tail holds and what the EOS detector looks for. tail_context overrides
    `seer.tail_context` (the cut slots the later steps still run as committed EOS).
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt must have at least one token")
    config.validate(backend.max_seq_len, max(len(p) for p in prompts))
    check_supported(config, backend)
    check_tail_override(tail_context, seer is not None or kept_lengths is not None)
    if pad_id == mask_id:
        raise ConfigError(f"pad_id equals mask_id ({mask_id}): padding would be denoised; pad with EOS instead")
    ctx = LoopContext(
        backend, core if core is not None else active_core(), config, mask_id, np.random.default_rng(seed)
    )
    state = start_state(prompts, np.full((len(prompts), config.gen_length), mask_id, dtype=np.int64), pad_id)
    B, P = len(prompts), state.prompt_width
    blocks = full_blocks(config)
    first = blocks[0]
    left = ctx.core.masks_left(
        state.x, np.full(B, P + first.start, np.int64), np.full(B, P + first.end, np.int64), mask_id
    )
    schedule = ctx.core.transfer_schedule(left, first.steps)
    out0 = step_zero(ctx, state, P + first.end, schedule[:, 0])
    if seer is not None or kept_lengths is not None:
        return _run_truncated(
            ctx, state, out0, prompts, pad_id, pad_id if eos_id is None else eos_id, seer, kept_lengths, tail_context
        )
    run_blocks(ctx, state, blocks, first_schedule=np.ascontiguousarray(schedule[:, 1:]))
    return LoopResult(tokens=state.responses.copy(), steps_run=state.steps_run, tokens_processed=state.tokens_processed)


def _run_truncated(
    ctx: LoopContext,
    state: LoopState,
    out0: Step0Output,
    prompts: list[list[int]],
    pad_id: int,
    eos_id: int,
    seer: SeerConfig | None,
    kept_lengths: Sequence[int] | None,
    tail_context: TailContext | None = None,
) -> LoopResult:
    """Seer after step zero: plan every request (seer.plan decides), run the rows in the groups the batch scheduler
    chooses (runtime.scheduler: each row on its own prompt + kept length and schedule), and fill the cut tails with
    EOS."""
    config = ctx.config
    G = config.gen_length
    responses = state.responses.copy()
    plans = plan_batch(
        out0,
        list(ctx.backend.sparsity_rows),
        state.prompt_width,
        responses,
        seer=seer,
        eos_id=eos_id,
        mask_id=ctx.mask_id,
        gen_length=G,
        steps=config.steps,
        block_length=config.block_length,
        kept_lengths=kept_lengths,
        tail_context=tail_context,
    )
    hybrid = run_hybrid(ctx, prompts, responses, plans, pad_id=pad_id, eos_id=eos_id)
    reports = [
        SeerReport.from_plan(plan, len(prompts[b]), forced=kept_lengths is not None) for b, plan in enumerate(plans)
    ]
    return LoopResult(
        tokens=hybrid.tokens,
        steps_run=state.steps_run + hybrid.steps_run,
        tokens_processed=state.tokens_processed + hybrid.tokens_processed,
        seer=reports,
    )
