"""The one executor of the denoising steps after step zero: a group of batch rows, each row on its own plan.

Every row carries its plan (`seer.plan.TruncationPlan`: its blocks, their steps, its kept length and tail context;
a row Seer does not cut has the full-length plan). The response region is right-padded with attention mask 0 and
positions come from the mask's cumsum, so a row's forward pass is the one it would get alone: at temperature 0
with low-confidence remasking its tokens are those of its solo run. (Random remasking scores and sampling seeds
are drawn per call, so those depend on the grouping, as they depend on the batch in any loop.)

A row entering a block splits the block's masks evenly over its steps (LLaDA), except block 0 of a row that kept
the schedule fixed before step zero (full length: `first_schedule`). A call carries only the rows that can commit
something at that step, trimmed to the columns they need, so rows that finish leave the batch; a step no row can
commit in is not run (the reference runs it and changes nothing).

With parallel decoding (`GenerationConfig.decode`) a row has no schedule: each pass commits what the rule accepts and
the row moves to its next block when its block has no masks left (`Cursor`). With the KV cache a row's pass is a
refresh (the group's columns, keys and values kept per row) when it enters a block, else a window step over its
block only (`_Group.refresh`, `_Group.window_step`; a model with shifted logits runs the column before its block
too: `core.backend.window_lead`). With the prompt cache every pass runs the last prompt token and the row's columns
against step zero's keys and values of the columns before them (`_Group.prompt_step`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from seer_deploy.core.backend import PromptInput, StepInput, WindowInput, kv_zeros, position_shift, window_lead
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, left_pad
from seer_deploy.runtime.loopcore import LoopCore
from seer_deploy.runtime.rules import StepCount, commit_rule
from seer_deploy.runtime.settled import SettledHook, SettledPrefixes
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.plan import BlockPlan, TruncationPlan

if TYPE_CHECKING:  # annotations only
    from seer_deploy.core.backend import Backend, CacheBackend, KVCache, PassOutput, PromptCacheBackend


def mask_columns(x: np.ndarray, hi: np.ndarray | None, mask_id: int) -> np.ndarray:
    """int64 [B, C]: each row's mask columns before hi[b] (every column with hi None) in column order, C the most any
    row has (at least 1), a shorter row repeating its last one (column 0 if it has none): a step's candidates."""
    B, S = x.shape
    is_mask = x == mask_id
    if hi is not None:
        is_mask &= np.arange(S)[None, :] < np.asarray(hi)[:, None]
    counts = is_mask.sum(axis=1)
    width = max(1, int(counts.max(initial=0)))
    order = np.argsort(~is_mask, axis=1, kind="stable")[:, :width]  # mask columns first, in column order
    last = order[np.arange(B), np.maximum(counts - 1, 0)]
    return np.ascontiguousarray(np.where(np.arange(width)[None, :] >= counts[:, None], last[:, None], order),
                                dtype=np.int64)


@dataclass(frozen=True)
class LoopContext:
    """What every step needs besides the sequence: the engine, the host core, the settings and the host RNG."""

    backend: Backend
    core: LoopCore
    config: GenerationConfig
    mask_id: int
    pad_id: int  # what left (and, in a group, right) padding holds
    eos_id: int  # what a cut tail holds
    rng: np.random.Generator  # random remasking scores and per-step sampling seeds
    seer: SeerConfig | None = None  # how step zero's boundary is read (None: the loop does not truncate by Seer)
    on_settled: SettledHook | None = None  # told when a row's settled prefix grows (streaming)

    @property
    def passes_per_step(self) -> int:
        """Forward passes one step costs: two with classifier-free guidance (the prompt-masked copy)."""
        return 2 if self.config.cfg_scale > 0 else 1

    def sampling(self) -> tuple[float, int | None]:
        """A pass's temperature and sampling seed (drawn from the host RNG at temperature > 0)."""
        seed = int(self.rng.integers(2**63 - 1)) if self.config.temperature > 0 else None
        return self.config.temperature, seed

    def step_input(self, x: np.ndarray, mask: np.ndarray | None, prompt_width: int, hi: np.ndarray | None = None
                   ) -> StepInput:
        """The backend's input for one step over x that commits before column hi[b] (None: anywhere): its candidates
        are the masks it may commit, so an exported graph computes tokens for those columns only."""
        return StepInput(x, mask, *self.sampling(), prompt_width, self.config.cfg_scale,
                         mask_columns(x, hi, self.mask_id), self.config.scoring())

    def commit(self, x: np.ndarray, out: PassOutput, lo: np.ndarray, hi: np.ndarray,
               k: np.ndarray, counts: Sequence[StepCount] | None = None) -> None:
        """Commit, in place, masked positions of row b in [lo[b], hi[b]): the top k[b] by the configured remasking,
        with parallel decoding (k[b] = -1) those the rule accepts, under the Dream family's sampler what each row's
        StepCount asks for (runtime.rules)."""
        if out.token_ids.shape != x.shape or out.confidence.shape != x.shape:
            raise ConfigError(
                f"the backend returned token_ids {out.token_ids.shape} and confidence {out.confidence.shape} for an "
                f"input of {x.shape}; it does not follow the Backend interface"
            )
        lo, hi = lo.astype(np.int64), hi.astype(np.int64)
        if self.config.dream_sampler:
            assert counts is not None, "the Dream family's sampler commits by StepCounts"
            commit_rule(self.core, self.config, self.rng, self.mask_id, x, out, (lo, hi), list(counts))
            return
        x0 = np.ascontiguousarray(out.token_ids, dtype=np.int64)
        if self.config.remasking == "random":
            confidence = self.rng.random(x.shape, dtype=np.float32)
        else:
            confidence = np.ascontiguousarray(out.confidence, dtype=np.float32)
        if self.config.parallel:
            thresholds = self.config.rank_thresholds(max(1, int((hi - lo).max(initial=1))))
            self.core.commit_confident(x, x0, confidence, lo, hi, thresholds, self.mask_id)
        else:
            self.core.commit_step(x, x0, confidence, lo, hi, k.astype(np.int64), self.mask_id)


@dataclass
class Tally:
    """What the forward passes cost."""

    passes: int = 0  # forward passes made (a guided step counts once)
    tokens_processed: int = 0  # real (non-padding) positions over those passes, guidance's copy included
    positions_computed: int = 0  # all positions over those passes, padding included (what the cost model trades)
    batch_sizes: list[int] = field(default_factory=list)  # rows per pass

    def count(self, ctx: LoopContext, real: np.ndarray) -> None:
        self.passes += 1
        self.tokens_processed += int(real.sum()) * ctx.passes_per_step
        self.positions_computed += real.size * ctx.passes_per_step
        self.batch_sizes.append(real.shape[0])


@dataclass(frozen=True)
class StepSlot:
    """One of a row's forward passes after step zero: the step `index` of its block [lo, hi) of `steps` steps."""

    lo: int  # response coordinates
    hi: int
    index: int
    steps: int
    first: bool  # block 0, whose first step was step zero


def step_slots(blocks: Sequence[BlockPlan]) -> tuple[StepSlot, ...]:
    """A row's passes after step zero in order (blocks[0].steps includes step zero, which has run)."""
    slots: list[StepSlot] = []
    for j, block in enumerate(blocks):
        n = block.steps - 1 if j == 0 else block.steps
        slots.extend(StepSlot(block.start, block.end, i, n, j == 0) for i in range(n))
    return tuple(slots)


@dataclass(frozen=True)
class Rows:
    """Batch rows after step zero: what each still has to run."""

    prompts: Sequence[Sequence[int]]  # as step zero left them (its commits inside a prompt stand)
    responses: np.ndarray  # int64 [B, gen_length]: the slots after step zero's commits
    plans: Sequence[TruncationPlan]
    first_schedule: np.ndarray | None = None  # int64 [B, s]: the rest of block 0's schedule when it was fixed
    # before step zero (full length); None splits the masks left in each block as a row enters it
    kv: KVCache | None = None  # float32 [layers, 2, B, kv_heads, S, head_dim]: step zero's keys and values. The
    # block-wise cache: when step zero was a refresh over the columns the rows run in (full length; None: each row
    # refreshes first). The prompt cache: its prompt columns (S = step zero's prompt width), always
    prompt_masks: np.ndarray | None = None  # int64 [B]: masks in each prompt before step zero (None: none)

    def take(self, rows: Sequence[int]) -> Rows:
        index = list(rows)
        schedule = None if self.first_schedule is None else np.ascontiguousarray(self.first_schedule[index])
        kv = None if self.kv is None else self.kv[:, :, index]
        masks = None if self.prompt_masks is None else self.prompt_masks[index]
        return Rows([self.prompts[b] for b in index], self.responses[index], [self.plans[b] for b in index], schedule,
                    kv, masks)


def run_group(ctx: LoopContext, rows: Rows, tally: Tally, batch_rows: Sequence[int] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Run the remaining steps of a group of rows (`batch_rows`: their rows in the batch, for `ctx.on_settled`);
    returns their responses int64 [n, gen_length] (cut tails EOS) and the forward passes each row made, int64 [n]."""
    group = _Group.start(ctx, rows)
    cursors = [Cursor(plan, ctx.config.parallel) for plan in rows.plans]
    settled = SettledPrefixes(ctx.on_settled, ctx.mask_id, list(batch_rows) if batch_rows is not None
                              else list(range(group.n)))
    settled.report(group.x, group.prompt_width, group.kept, np.arange(group.n))  # what step zero already settled
    while True:
        targets = [c.next(ctx, group, i, rows.first_schedule) for i, c in enumerate(cursors)]
        if all(t is None for t in targets):
            break
        lo, hi, k = (np.array([0 if t is None else t[j] for t in targets], np.int64) for j in range(3))
        active = np.array([t is not None for t in targets])
        # The stop test per row: a row that can commit nothing now is not sent.
        left = ctx.core.masks_left(group.x, np.zeros(group.n, np.int64), hi, ctx.mask_id)
        can = active & (left > 0) & ((k > 0) | ctx.config.parallel)
        if not can.any():
            continue
        if group.prompt_kv is not None:
            group.prompt_step(np.flatnonzero(can), hi, k, tally)
        elif group.cache is None:
            group.step(np.flatnonzero(can), hi, k, tally)
        else:
            fresh = can & (group.cache.block_lo != lo)  # entering a block (or no cache yet): refresh
            if fresh.any():
                group.refresh(np.flatnonzero(fresh), lo, hi, k, tally)
            if (can & ~fresh).any():
                group.window_step(np.flatnonzero(can & ~fresh), lo, hi, k, tally)
        settled.report(group.x, group.prompt_width, group.kept, np.flatnonzero(can))
    return group.tokens(), group.passes


class Columns(Protocol):
    """What a cursor reads of its rows: their columns (one row each) and the prompt width."""

    @property
    def x(self) -> np.ndarray: ...

    @property
    def prompt_width(self) -> int: ...


class Cursor:
    """Where one row is in its plan: the pass it makes next (its block and, with a schedule, how many it commits)."""

    def __init__(self, plan: TruncationPlan, parallel: bool) -> None:
        self.plan = plan
        self.parallel = parallel
        self.slots = () if parallel else step_slots(plan.blocks)
        self.position = 0  # fixed: the next slot; parallel: the current block
        self.schedule = np.zeros(0, np.int64)
        self.candidates: tuple[int, int] | None = None  # parallel: (block, masks before its end) at the last pass

    def next(self, ctx: LoopContext, group: Columns, row: int, first_schedule: np.ndarray | None
             ) -> tuple[int, int, int] | None:
        """(block start, block end in the group's columns, tokens to commit (-1: the parallel rule)), or None when
        the row is done; advances the cursor."""
        P, x = group.prompt_width, group.x[row : row + 1]
        if self.parallel:
            blocks = self.plan.blocks
            while self.position < len(blocks):  # a block ends when it has no masks left
                block = blocks[self.position]
                lo, hi = np.array([P + block.start]), np.array([P + block.end])
                candidates = int(ctx.core.masks_left(x, np.zeros(1, np.int64), hi, ctx.mask_id)[0])
                stuck = self.candidates == (self.position, candidates)  # the last pass changed none of them
                if ctx.core.masks_left(x, lo, hi, ctx.mask_id)[0] > 0 and not stuck:
                    self.candidates = (self.position, candidates)
                    return P + block.start, P + block.end, -1
                self.position += 1
            return None
        if self.position >= len(self.slots):
            return None  # this row is done: it has left the batch
        slot = self.slots[self.position]
        self.position += 1
        if slot.index == 0:  # entering a block: its schedule
            if slot.first and first_schedule is not None:
                self.schedule = first_schedule[row]
            else:
                left = ctx.core.masks_left(x, np.array([P + slot.lo]), np.array([P + slot.hi]), ctx.mask_id)
                self.schedule = ctx.core.transfer_schedule(left, slot.steps)[0]
        return P + slot.lo, P + slot.hi, int(self.schedule[slot.index])


@dataclass
class _Cache:
    """The group's block-wise KV cache: every row's keys and values from its last refresh, and the block they are
    for (-1: none yet)."""

    kv: KVCache | None  # float32 [layers, 2, n, kv_heads, columns, head_dim], on the host or the engine's device
    block_lo: np.ndarray  # int64 [n]


@dataclass
class _Group:
    """The rows of a group side by side: left-padded prompts, then each row's kept slots and tail context, right
    padding (mask 0) up to the widest."""

    ctx: LoopContext
    x: np.ndarray  # int64 [n, P + K]
    real: np.ndarray  # int64 [n, P + K]
    prompt_lengths: np.ndarray
    kept: np.ndarray
    width: np.ndarray
    cache: _Cache | None
    passes: np.ndarray  # int64 [n]: forward passes each row made
    # the prompt cache: [layers, 2, n, kv_heads, P - 1, head_dim], the columns before the last prompt token
    prompt_kv: KVCache | None = None
    # int64 [n]: an M-RoPE model's (Dimple's) cached passes' position shift per row (core.backend.position_shift)
    position_shift: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def prompt_width(self) -> int:
        return int(self.prompt_lengths.max())

    @classmethod
    def start(cls, ctx: LoopContext, rows: Rows) -> _Group:
        prompts, responses, plans = rows.prompts, rows.responses, rows.plans
        n = responses.shape[0]
        kept = np.array([plan.kept for plan in plans], dtype=np.int64)
        width = np.array([plan.width for plan in plans], dtype=np.int64)
        plen = np.array([len(p) for p in prompts], dtype=np.int64)
        P, K = int(plen.max()), int(width.max())
        ids, prompt_real = left_pad(prompts, ctx.pad_id)
        x = np.full((n, P + K), ctx.pad_id, dtype=np.int64)
        real = np.zeros((n, P + K), dtype=np.int64)
        x[:, :P], real[:, :P] = ids, prompt_real
        for i in range(n):
            x[i, P : P + kept[i]] = responses[i, : kept[i]]
            x[i, P + kept[i] : P + width[i]] = ctx.eos_id  # the tail context: committed, past every block
            real[i, P : P + width[i]] = 1
        cache, prompt_kv = None, None
        if ctx.config.kv_cache:
            kv = rows.kv if rows.kv is not None and rows.kv.shape[4] == P + K else None
            first = np.full(n, P + plans[0].blocks[0].start if kv is not None else -1, dtype=np.int64)
            cache = _Cache(kv, first)
        if ctx.config.prompt_cache:
            assert rows.kv is not None, "the prompt cache is cut from step zero's keys and values"
            widest = rows.kv.shape[4]  # step zero's prompt width: the group's prompts are its last P columns
            prompt_kv = rows.kv[:, :, :, :, widest - P : widest - 1]
        shift = position_shift(ctx.backend, x, real) if cache is not None or prompt_kv is not None else None
        return cls(ctx, x, real, plen, kept, width, cache, np.zeros(n, np.int64), prompt_kv, shift)

    def step(self, rows: np.ndarray, hi: np.ndarray, k: np.ndarray, tally: Tally,
             counts: Sequence[StepCount] | None = None) -> None:
        """An uncached pass for `rows`, trimmed to the columns they need; commits before hi (`counts`: the Dream
        family's sampler)."""
        P = self.prompt_width
        c0, c1 = P - int(self.prompt_lengths[rows].max()), P + int(self.width[rows].max())
        sub = np.ascontiguousarray(self.x[rows, c0:c1])
        sub_real = self.real[rows, c0:c1]
        mask = None if bool(sub_real.all()) else np.ascontiguousarray(sub_real)
        out = self.ctx.backend.step(self.ctx.step_input(sub, mask, P - c0, hi[rows] - c0))
        self.ctx.commit(sub, out, np.zeros(rows.size, np.int64), hi[rows] - c0, k[rows], counts)
        self.x[rows, c0:c1] = sub
        self.passes[rows] += 1
        tally.count(self.ctx, sub_real)

    def prompt_step(self, rows: np.ndarray, hi: np.ndarray, k: np.ndarray, tally: Tally,
                    counts: Sequence[StepCount] | None = None) -> None:
        """A pass for `rows` against the prompt cache: the last prompt token and their response columns run, the
        columns before them come from the cache; commits before hi (`counts`: the Dream family's sampler)."""
        assert self.prompt_kv is not None
        backend = cast("PromptCacheBackend", self.ctx.backend)
        P = self.prompt_width
        c0, c1 = P - 1, P + int(self.width[rows].max())
        sub = np.ascontiguousarray(self.x[rows, c0:c1])
        temperature, seed = self.ctx.sampling()
        run = PromptInput(sub, np.ascontiguousarray(self.real[rows, :c1]), self.prompt_kv[:, :, rows], temperature,
                          seed, mask_columns(sub, hi[rows] - c0, self.ctx.mask_id), P, self.ctx.config.scoring(),
                          self._shift(rows))
        out = backend.prompt_step(run)
        self.ctx.commit(sub, out, np.ones(rows.size, np.int64), hi[rows] - c0, k[rows], counts)
        self.x[rows, c0:c1] = sub
        self.passes[rows] += 1
        tally.count(self.ctx, self.real[rows, c0:c1])

    def refresh(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, k: np.ndarray, tally: Tally) -> None:
        """A full pass for `rows` (the group's columns) that also refills their keys and values; commits before hi."""
        assert self.cache is not None
        backend = cast("CacheBackend", self.ctx.backend)
        sub = np.ascontiguousarray(self.x[rows])
        sub_real = np.ascontiguousarray(self.real[rows])
        out = backend.refresh(self.ctx.step_input(sub, sub_real, self.prompt_width, hi[rows]))
        self.ctx.commit(sub, out, np.zeros(rows.size, np.int64), hi[rows], k[rows])
        self.x[rows] = sub
        if self.cache.kv is None:
            shape = list(out.kv.shape)
            shape[2] = self.n
            self.cache.kv = kv_zeros(out.kv, tuple(shape))  # where the backend keeps it: the host or its device
        self.cache.kv[:, :, rows] = out.kv
        self.cache.block_lo[rows] = lo[rows]
        self.passes[rows] += 1
        tally.count(self.ctx, sub_real)

    def window_step(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, k: np.ndarray, tally: Tally) -> None:
        """A cached pass for `rows`: only a window holding each row's block runs; commits inside the block."""
        assert self.cache is not None and self.cache.kv is not None
        backend = cast("CacheBackend", self.ctx.backend)
        S = self.x.shape[1]
        lead = window_lead(backend)  # shifted logits: the column before the block predicts its first token
        W = int((hi[rows] - lo[rows]).max()) + lead
        start = np.minimum(lo[rows] - lead, S - W)  # a window never runs past the group's columns
        columns = start[:, None] + np.arange(W)[None, :]
        sub = np.ascontiguousarray(np.take_along_axis(self.x[rows], columns, axis=1))
        window = WindowInput(sub, np.ascontiguousarray(self.real[rows]), start, self.cache.kv[:, :, rows],
                             *self.ctx.sampling(), prompt_width=self.prompt_width,
                             position_shift=self._shift(rows))
        out = backend.window_step(window)
        self.ctx.commit(sub, out, lo[rows] - start, hi[rows] - start, k[rows])
        for j, b in enumerate(rows):
            self.x[b, start[j] : start[j] + W] = sub[j]
        self.passes[rows] += 1
        tally.count(self.ctx, np.take_along_axis(self.real[rows], columns, axis=1))

    def _shift(self, rows: np.ndarray) -> np.ndarray | None:
        return None if self.position_shift is None else self.position_shift[rows]

    def tokens(self) -> np.ndarray:
        G = self.ctx.config.gen_length
        tokens = np.full((self.n, G), self.ctx.eos_id, dtype=np.int64)
        P = self.prompt_width
        for i in range(self.n):
            tokens[i, : self.kept[i]] = self.x[i, P : P + self.kept[i]]
        return tokens
