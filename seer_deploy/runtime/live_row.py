"""One live row of step-level continuous batching (`runtime.live`): its own columns (prompt, then its response
slots), its plan and cursor after step zero, its keys and values, its own random generator, and the pass it makes
next. Its passes are `run_generation`'s for the row alone, in the same order: step zero (with Seer's statistics
where Seer cuts it; a sampled row then commits in a second pass at the same input, as alone), the plan, then the
cursor's passes (a refresh when it enters a block with the KV cache, else a window step), each skipped where it
could commit nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from seer_deploy.core.backend import KVCache, Step0Output
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.runtime.executor import Cursor, LoopContext
from seer_deploy.runtime.scheduler import RowWork
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.plan import SeerReport, TruncationPlan, full_length_plan, plan_batch


@dataclass(frozen=True)
class RowRequest:
    """What a row brings: its prompt ids, its settings, its Seer config (None: full length), its seed, and who is
    told its settled response prefix as it grows (streaming)."""

    prompt: Sequence[int]
    config: GenerationConfig
    seer: SeerConfig | None = None
    seed: int = 0
    on_settled: Callable[[np.ndarray], None] | None = None


@dataclass(frozen=True)
class FinishedRow:
    handle: int
    tokens: np.ndarray  # int64 [gen_length] response ids; a cut tail holds EOS
    report: SeerReport | None  # what Seer did, None at full length
    passes: int  # forward passes the row made, step zero included


def takes(config: GenerationConfig, seer: SeerConfig | None, window_lead: int = 0) -> bool:
    """Whether a row can live here: all but progressive step zero (`SeerConfig.first_canvas`), whose short canvas
    is a call of its own kind, the Dream family's rules (their loop, `runtime.rule_loop`, is not a live row's yet),
    the prompt cache, and the block-wise cache on a model whose windows run a column before the block
    (`core.backend.window_lead` > 0); a server runs those rows per call, through the same loop as `generate`."""
    if config.dream_sampler or config.first_from_prompt or config.prompt_cache or (config.kv_cache and window_lead):
        return False
    return seer is None or not 0 < seer.first_canvas < config.gen_length


class RowPass(NamedTuple):
    """A row's next forward pass: its kind, the end of the columns it may commit in (own coordinates), how many it
    commits (-1: the parallel rule), where its block starts, and whether it commits at all (a sampled step zero's
    statistics pass does not)."""

    kind: str
    hi: int
    k: int
    lo: int = 0
    commits: bool = True
    stats: bool = False  # step zero's statistics wanted (its cut is read from them)
    greedy: bool = False  # run at temperature 0 whatever the row's (the statistics pass is greedy, as step0 is)


class _View(NamedTuple):
    """What `Cursor.next` reads of a row: its sequence (one row) and prompt width."""

    x: np.ndarray
    prompt_width: int


class LiveRow:
    """One live row: its own columns (prompt, then its response slots) and where it is in its plan."""

    def __init__(self, handle: int, request: RowRequest, ctx: LoopContext, order: int) -> None:
        config = request.config
        self.handle, self.request, self.order = handle, request, order
        self.prompt_len = len(request.prompt)
        G = config.gen_length
        self.seq = np.concatenate([np.asarray(request.prompt, np.int64), np.full(G, ctx.mask_id, np.int64)])
        self.rng = np.random.default_rng(request.seed)
        first = full_length_plan(G, config.steps, config.block_length).blocks[0]
        left = ctx.core.masks_left(self.seq[None], np.array([self.prompt_len + first.start]),
                                   np.array([self.prompt_len + first.end]), ctx.mask_id)
        schedule = ctx.core.transfer_schedule(left, first.steps)
        self.first_end, self.zero_k = self.prompt_len + first.end, int(schedule[0, 0])
        self.truncating = request.seer is not None
        self.first_schedule = None if self.truncating else schedule[:, 1:]
        self.plan: TruncationPlan | None = None
        self.cursor: Cursor | None = None
        self.out0: Step0Output | None = None  # a sampled row's step-zero statistics, until its sampled pass
        self.kv: KVCache | None = None
        self.block_lo = -1
        self.passes = 0  # after step zero
        self.settled = 0
        self.pending: RowPass | None = self._zero_pass(config)
        self.virtual = 0.0  # positions computed for the row since it joined, from the live rows' least (fair share)

    @property
    def config(self) -> GenerationConfig:
        return self.request.config

    @property
    def width(self) -> int:
        """Response columns the row runs now: gen_length until its plan, then kept + tail context."""
        return len(self.seq) - self.prompt_len

    def _zero_pass(self, config: GenerationConfig) -> RowPass:
        if self.truncating:  # Seer reads step zero: the greedy pass with statistics (then, sampled, the commit)
            return RowPass("step0", self.first_end, self.zero_k, commits=config.temperature == 0, stats=True,
                         greedy=True)
        return RowPass("refresh" if config.kv_cache else "step", self.first_end, self.zero_k)

    @property
    def cost(self) -> int:
        """Positions the row's next pass computes (a window step: its window)."""
        p = self.pending
        return len(self.seq) if p is None or p.kind != "window_step" else p.hi - p.lo

    def work(self) -> RowWork:
        """What the row still has to run, for the cost model."""
        left = self.plan.steps - 1 - self.passes if self.plan is not None else self.config.steps
        return RowWork(self.prompt_len, self.width, max(1, left))

    def settings(self) -> Hashable:
        c = self.config
        return c.gen_length, c.steps, c.block_length, c.temperature, c.kv_cache, self.request.seer

    def after_pass(self, ctx: LoopContext, done: RowPass, sparsity_rows: list[Any]) -> None:
        """Move on from the pass just made: plan after step zero, report the settled prefix, find the next pass."""
        if done.kind == "step0" or self.plan is None:
            if not done.commits:  # the sampled step zero commits in a pass of its own, at the same input
                self.pending = RowPass("step", self.first_end, self.zero_k)
                return
            self._plan(ctx, sparsity_rows)
        else:
            self.passes += 1
        self._report(ctx)
        self.pending = self._next(ctx)

    def _plan(self, ctx: LoopContext, sparsity_rows: list[Any]) -> None:
        config, P = self.config, self.prompt_len
        if self.truncating:
            assert self.out0 is not None
            plan = plan_batch(self.out0, sparsity_rows, P, self.seq[None, P:], config,
                              SpecialIds(ctx.mask_id, ctx.pad_id, ctx.eos_id), seer=self.request.seer)[0]
            kept = self.seq[P : P + plan.kept]
            self.seq = np.concatenate([self.seq[:P], kept, np.full(plan.context, ctx.eos_id, np.int64)])
            self.out0, self.kv = None, None
        else:
            plan = full_length_plan(config.gen_length, config.steps, config.block_length)
            if self.kv is not None:  # step zero was a refresh over the columns the row runs in: block 0's cache
                self.block_lo = P + plan.blocks[0].start
        self.plan, self.cursor = plan, Cursor(plan, config.parallel)

    def _next(self, ctx: LoopContext) -> RowPass | None:
        """The row's next pass after step zero (passes that could commit nothing are skipped, as alone); None: done."""
        assert self.cursor is not None
        view = _View(self.seq[None], self.prompt_len)
        while (target := self.cursor.next(ctx, view, 0, self.first_schedule)) is not None:
            lo, hi, k = target
            left = int(ctx.core.masks_left(view.x, np.zeros(1, np.int64), np.array([hi]), ctx.mask_id)[0])
            if left > 0 and (k > 0 or self.config.parallel):
                if not self.config.kv_cache:
                    return RowPass("step", hi, k)
                return RowPass("refresh" if self.block_lo != lo else "window_step", hi, k, lo)
        return None

    def _report(self, ctx: LoopContext) -> None:
        if self.request.on_settled is None or self.plan is None:
            return
        response = self.seq[self.prompt_len : self.prompt_len + self.plan.kept]
        masked = np.flatnonzero(response == ctx.mask_id)
        n = int(masked[0]) if masked.size else self.plan.kept
        if n > self.settled:
            self.settled = n
            self.request.on_settled(response[:n].copy())

    def finished(self, ctx: LoopContext) -> FinishedRow:
        assert self.plan is not None
        tokens = np.full(self.config.gen_length, ctx.eos_id, np.int64)
        tokens[: self.plan.kept] = self.seq[self.prompt_len : self.prompt_len + self.plan.kept]
        passes = 1 + self.passes
        report = None
        if self.truncating:
            made = passes if self.config.parallel or self.config.kv_cache else None
            report = SeerReport.from_plan(self.plan, self.prompt_len, ctx.passes_per_step, passes=made)
        return FinishedRow(self.handle, tokens, report, passes)
