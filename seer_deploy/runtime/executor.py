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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from seer_deploy.core.backend import Backend, Step0Output, StepInput, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, left_pad
from seer_deploy.runtime.loopcore import LoopCore
from seer_deploy.seer.plan import BlockPlan, TruncationPlan


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

    @property
    def passes_per_step(self) -> int:
        """Forward passes one step costs: two with classifier-free guidance (the prompt-masked copy)."""
        return 2 if self.config.cfg_scale > 0 else 1

    def step_input(self, x: np.ndarray, mask: np.ndarray | None, prompt_width: int) -> StepInput:
        """The backend's input for one step over x (a sampling seed drawn from the host RNG at temperature > 0)."""
        seed = int(self.rng.integers(2**63 - 1)) if self.config.temperature > 0 else None
        return StepInput(x, mask, self.config.temperature, seed, prompt_width, self.config.cfg_scale)

    def commit(self, x: np.ndarray, out: StepOutput | Step0Output, hi: np.ndarray, k: np.ndarray) -> None:
        """Commit, in place, the top k[b] masked positions of row b before hi[b] by the configured remasking."""
        if out.token_ids.shape != x.shape or out.confidence.shape != x.shape:
            raise ConfigError(
                f"the backend returned token_ids {out.token_ids.shape} and confidence {out.confidence.shape} for an "
                f"input of {x.shape}; it does not follow the Backend interface"
            )
        x0 = np.ascontiguousarray(out.token_ids, dtype=np.int64)
        if self.config.remasking == "random":
            confidence = self.rng.random(x.shape, dtype=np.float32)
        else:
            confidence = np.ascontiguousarray(out.confidence, dtype=np.float32)
        B = x.shape[0]
        self.core.commit_step(x, x0, confidence, np.zeros(B, np.int64), hi.astype(np.int64), k.astype(np.int64),
                              self.mask_id)


@dataclass
class Tally:
    """What the forward passes cost."""

    steps_run: int = 0  # forward passes made (a guided step counts once)
    tokens_processed: int = 0  # real (non-padding) positions over those passes, guidance's copy included
    positions_computed: int = 0  # all positions over those passes, padding included (what the cost model trades)
    batch_sizes: list[int] = field(default_factory=list)  # rows per pass

    def count(self, ctx: LoopContext, real: np.ndarray) -> None:
        self.steps_run += 1
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

    def take(self, rows: Sequence[int]) -> Rows:
        index = list(rows)
        schedule = None if self.first_schedule is None else np.ascontiguousarray(self.first_schedule[index])
        return Rows([self.prompts[b] for b in index], self.responses[index], [self.plans[b] for b in index], schedule)


def run_group(ctx: LoopContext, rows: Rows, tally: Tally) -> np.ndarray:
    """Run the remaining steps of a group of rows; returns their responses int64 [n, gen_length] (cut tails EOS)."""
    core, mask_id, pad_id, eos_id = ctx.core, ctx.mask_id, ctx.pad_id, ctx.eos_id
    prompts, responses, plans, first_schedule = rows.prompts, rows.responses, rows.plans, rows.first_schedule
    n, G = responses.shape
    kept = np.array([plan.kept for plan in plans], dtype=np.int64)
    width = np.array([plan.width for plan in plans], dtype=np.int64)
    plen = np.array([len(p) for p in prompts], dtype=np.int64)
    P, K = int(plen.max()), int(width.max())
    ids, prompt_real = left_pad(prompts, pad_id)
    x = np.full((n, P + K), pad_id, dtype=np.int64)
    real = np.zeros((n, P + K), dtype=np.int64)
    x[:, :P], real[:, :P] = ids, prompt_real
    for i in range(n):
        x[i, P : P + kept[i]] = responses[i, : kept[i]]
        x[i, P + kept[i] : P + width[i]] = eos_id  # the tail context: committed, past every block, never a candidate
        real[i, P : P + width[i]] = 1
    slots = [step_slots(plan.blocks) for plan in plans]
    schedules: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    zeros = np.zeros(n, np.int64)
    for t in range(max(len(s) for s in slots)):
        hi, k = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i in range(n):
            if t >= len(slots[i]):
                continue  # this row is done: it has left the batch
            slot = slots[i][t]
            if slot.index == 0:  # entering a block: its schedule
                if slot.first and first_schedule is not None:
                    schedules[i] = first_schedule[i]
                else:
                    left = core.masks_left(x[i : i + 1], np.array([P + slot.lo]), np.array([P + slot.hi]), mask_id)
                    schedules[i] = core.transfer_schedule(left, slot.steps)[0]
            hi[i], k[i] = P + slot.hi, schedules[i][slot.index]
        # The stop test per row: a row that can commit nothing now is not sent.
        can = np.flatnonzero(np.minimum(k, core.masks_left(x, zeros, hi, mask_id)) > 0)
        if can.size == 0:
            continue
        c0, c1 = P - int(plen[can].max()), P + int(width[can].max())
        sub = np.ascontiguousarray(x[can, c0:c1])
        sub_real = real[can, c0:c1]
        mask = None if bool(sub_real.all()) else np.ascontiguousarray(sub_real)
        out = ctx.backend.step(ctx.step_input(sub, mask, P - c0))
        ctx.commit(sub, out, hi[can] - c0, k[can])
        x[can, c0:c1] = sub
        tally.count(ctx, sub_real)
    tokens = np.full((n, G), eos_id, dtype=np.int64)
    for i in range(n):
        tokens[i, : kept[i]] = x[i, P : P + kept[i]]
    return tokens
