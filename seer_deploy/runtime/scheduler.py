"""Hybrid batched execution after Seer's cut: which rows of a batch run together, and running them.

After step zero every row has its own kept length and block plan. Rows with the same plan form a unit
(`seer.plan.group_rows`, shortest kept length first). Running neighbouring units merged saves forward passes but
pads the shorter rows to the longer kept length; running them apart saves the padded tokens. A cost model of one
forward pass, `a + b * batch * seq_len`, simulated over the steps that remain, chooses the cheapest split of the
units into contiguous groups (`plan_hybrid`, a small dynamic program; pure, so it is tested on its own).

Inside a group every row keeps its own schedule: its blocks, the transfer schedule fixed when it enters a block,
its stop test; a row with a tail context (`SeerConfig.tail_context`) carries its committed EOS slots after the kept
ones. The response region is right-padded with attention mask 0 and positions come from the mask's cumsum, so a
row's forward pass is the one it would get alone: at temperature 0 with low-confidence remasking its tokens are
those of its solo run. (Random remasking scores and sampling seeds are drawn per call, so those depend on the
grouping, as they depend on the batch in any loop.) A call carries only the rows that can commit something at that
step, trimmed to the columns they need, so rows that finish leave the batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from seer_deploy.core.backend import Backend, Step0Output, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.seer.plan import BlockPlan, TruncationPlan, group_rows

if TYPE_CHECKING:
    from seer_deploy.runtime.loop import LoopContext

# Default step cost: 0.5 ms per call plus 1 us per position (the fixed cost of a call is worth ~500 positions).
# Only the ratio a / b changes a decision; measure_step_cost fits both for a backend.
DEFAULT_CALL_SECONDS = 5e-4
DEFAULT_TOKEN_SECONDS = 1e-6


@dataclass(frozen=True)
class StepCost:
    """Seconds of one forward pass over `batch` rows of `seq` positions: a + b * batch * seq."""

    a: float = DEFAULT_CALL_SECONDS  # fixed cost of a call (launch, session, host copies)
    b: float = DEFAULT_TOKEN_SECONDS  # cost per position computed, padding included

    def __post_init__(self) -> None:
        if not (self.a >= 0 and self.b > 0):
            raise ConfigError(f"step cost a={self.a}, b={self.b}: need a >= 0 and b > 0 (seconds per call / token)")

    def call(self, batch: int, seq: int) -> float:
        return self.a + self.b * batch * seq


@dataclass(frozen=True)
class RowWork:
    """What one row still has to run after step zero."""

    prompt_len: int
    width: int  # response slots in the later steps' input: the kept ones and any committed EOS context after them
    steps: int  # forward passes left (at most; steps that cannot commit are skipped)

    @classmethod
    def from_plan(cls, plan: TruncationPlan, prompt_len: int) -> RowWork:
        return cls(prompt_len, plan.width, plan.steps - 1)


def group_cost(rows: Sequence[RowWork], cost: StepCost) -> float:
    """Predicted seconds to run `rows` as one group: at step t the rows with more than t steps left run, padded to
    their widest prompt plus their widest response (kept slots and tail context)."""
    if not rows:
        return 0.0
    order = sorted(rows, key=lambda r: -r.steps)
    total, width_p, width_k = 0.0, 0, 0
    for n, row in enumerate(order, start=1):
        width_p, width_k = max(width_p, row.prompt_len), max(width_k, row.width)
        below = order[n].steps if n < len(order) else 0
        total += (row.steps - below) * cost.call(n, width_p + width_k)  # steps where exactly the first n rows run
    return total


@dataclass(frozen=True)
class HybridPlan:
    """The groups to run (batch row indices, each group ascending) and the cost model's view of the choice."""

    groups: tuple[tuple[int, ...], ...]
    cost: float  # predicted seconds of this choice
    apart_cost: float  # every unit (rows of equal plans) on its own
    merged_cost: float  # the whole batch as one group, padded to the longest kept length


def split_units(units: Sequence[Sequence[RowWork]], cost: StepCost) -> list[tuple[int, int]]:
    """The cheapest split of the units (in kept-length order) into contiguous runs [i, j); ties go to fewer runs."""
    n = len(units)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # i ascending: on equal cost the longest merged run wins (fewer calls)
            c = best[i] + group_cost([r for u in units[i:j] for r in u], cost)
            if c < best[j]:
                best[j], cut[j] = c, i
    runs = []
    j = n
    while j > 0:
        runs.append((cut[j], j))
        j = cut[j]
    return runs[::-1]


def plan_hybrid(plans: Sequence[TruncationPlan], prompt_lens: Sequence[int], cost: StepCost) -> HybridPlan:
    """Which rows run together after step zero: units of equal plans, merged where the cost model says so."""
    if len(plans) != len(prompt_lens):
        raise ConfigError(f"{len(plans)} plans for {len(prompt_lens)} prompts; give one plan per row")
    units = [rows for _, rows in group_rows(plans)]
    work = [[RowWork.from_plan(plans[b], prompt_lens[b]) for b in rows] for rows in units]
    runs = split_units(work, cost)
    groups = tuple(tuple(sorted(b for u in units[i:j] for b in u)) for i, j in runs)
    return HybridPlan(
        groups=groups,
        cost=sum(group_cost([r for u in work[i:j] for r in u], cost) for i, j in runs),
        apart_cost=sum(group_cost(u, cost) for u in work),
        merged_cost=group_cost([r for u in work for r in u], cost),
    )


@dataclass(frozen=True)
class StepSlot:
    """One of a row's forward passes after step zero: the step `index` of its block [lo, hi) of `steps` steps."""

    lo: int  # response coordinates
    hi: int
    index: int
    steps: int


def step_slots(blocks: Sequence[BlockPlan]) -> tuple[StepSlot, ...]:
    """A row's passes after step zero in order (blocks[0].steps includes step zero, which has run)."""
    slots: list[StepSlot] = []
    for j, block in enumerate(blocks):
        n = block.steps - 1 if j == 0 else block.steps
        slots.extend(StepSlot(block.start, block.end, i, n) for i in range(n))
    return tuple(slots)


# ---------------------------------------------------------------- the cost of a backend


class CostedBackend:
    """A backend carrying its measured `StepCost`, which the scheduler then uses instead of the default."""

    def __init__(self, inner: Backend, step_cost: StepCost) -> None:
        self.inner = inner
        self.step_cost = step_cost
        self.name: str = inner.name
        self.max_seq_len: int = inner.max_seq_len
        self.sparsity_rows: list[tuple[int, str]] = list(inner.sparsity_rows)

    def step0(self, input_ids: np.ndarray, attention_mask: np.ndarray | None) -> Step0Output:
        return self.inner.step0(input_ids, attention_mask)

    def step(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> StepOutput:
        return self.inner.step(input_ids, attention_mask, temperature, seed)


def step_cost_of(backend: Backend) -> StepCost:
    """The backend's own StepCost when it carries one (CostedBackend), else the default."""
    cost = getattr(backend, "step_cost", None)
    return cost if isinstance(cost, StepCost) else StepCost()


def measure_step_cost(
    backend: Backend,
    *,
    shapes: Sequence[tuple[int, int]] = ((1, 16), (1, 64), (4, 16), (4, 64)),
    repeats: int = 3,
    token_id: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> StepCost:
    """Fit a and b to the fastest of `repeats` timed step calls at each (batch, seq) shape (least squares)."""
    if len(shapes) < 2 or len({b * s for b, s in shapes}) < 2:
        raise ConfigError("measure_step_cost needs shapes with at least two different batch * seq sizes")
    if repeats < 1:
        raise ConfigError("measure_step_cost needs repeats >= 1")
    sizes, seconds = [], []
    for batch, seq in shapes:
        ids = np.full((batch, min(seq, backend.max_seq_len)), token_id, dtype=np.int64)
        backend.step(ids, None)  # warm-up: first calls allocate
        best = float("inf")
        for _ in range(repeats):
            start = clock()
            backend.step(ids, None)
            best = min(best, clock() - start)
        sizes.append(ids.size)
        seconds.append(best)
    b, a = np.polyfit(np.asarray(sizes, dtype=np.float64), np.asarray(seconds, dtype=np.float64), 1)
    return StepCost(a=max(float(a), 0.0), b=max(float(b), 1e-12))


# ---------------------------------------------------------------- running the plan


@dataclass
class HybridResult:
    tokens: np.ndarray  # int64 [B, gen_length]; the cut tails hold EOS
    steps_run: int  # forward passes made
    tokens_processed: int  # real (non-padding) positions over those passes
    positions_computed: int  # all positions over those passes, padding included (what the cost model trades)
    plan: HybridPlan


def run_hybrid(
    ctx: LoopContext,
    prompts: Sequence[Sequence[int]],
    responses: np.ndarray,
    plans: Sequence[TruncationPlan],
    *,
    pad_id: int,
    eos_id: int,
    cost: StepCost | None = None,
) -> HybridResult:
    """Run every row's remaining steps (after step zero) in the groups `plan_hybrid` chooses.

    responses: int64 [B, gen_length], the response slots after step zero's commits. cost: the step cost model
    (default: the backend's own, see `step_cost_of`).
    """
    B, G = responses.shape
    if len(prompts) != B or len(plans) != B:
        raise ConfigError(f"{len(prompts)} prompts and {len(plans)} plans for {B} responses; give one per row")
    hybrid = plan_hybrid(plans, [len(p) for p in prompts], cost or step_cost_of(ctx.backend))
    result = HybridResult(np.full((B, G), eos_id, dtype=np.int64), 0, 0, 0, hybrid)
    for rows in hybrid.groups:
        _run_group(ctx, result, rows, prompts, responses, plans, pad_id, eos_id)
    return result


def _run_group(
    ctx: LoopContext,
    result: HybridResult,
    rows: Sequence[int],
    prompts: Sequence[Sequence[int]],
    responses: np.ndarray,
    plans: Sequence[TruncationPlan],
    pad_id: int,
    eos_id: int,
) -> None:
    """One group: left-padded prompts, right-padded kept responses (each followed by its committed EOS context, if
    any), each row on its own schedule."""
    core, mask_id = ctx.core, ctx.mask_id
    n = len(rows)
    plen = np.array([len(prompts[b]) for b in rows], dtype=np.int64)
    kept = np.array([plans[b].kept for b in rows], dtype=np.int64)
    width = np.array([plans[b].width for b in rows], dtype=np.int64)
    P, K = int(plen.max()), int(width.max())
    x = np.full((n, P + K), pad_id, dtype=np.int64)
    real = np.zeros((n, P + K), dtype=np.int64)
    for i, b in enumerate(rows):
        x[i, P - plen[i] : P] = prompts[b]
        x[i, P : P + kept[i]] = responses[b, : kept[i]]
        x[i, P + kept[i] : P + width[i]] = eos_id  # the context: committed, past every block, never a candidate
        real[i, P - plen[i] : P + width[i]] = 1
    slots = [step_slots(plans[b].blocks) for b in rows]
    schedules: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    zeros = np.zeros(n, np.int64)
    for t in range(max(len(s) for s in slots)):
        hi, k = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i in range(n):
            if t >= len(slots[i]):
                continue  # this row is done: it has left the batch
            slot = slots[i][t]
            if slot.index == 0:  # entering a block: split its masks evenly over its steps (LLaDA)
                left = core.masks_left(x[i : i + 1], np.array([P + slot.lo]), np.array([P + slot.hi]), mask_id)
                schedules[i] = core.transfer_schedule(left, slot.steps)[0]
            hi[i], k[i] = P + slot.hi, schedules[i][slot.index]
        # The stop test per row: a row that can commit nothing now is not sent (its solo run skips or wastes it).
        can = np.flatnonzero(np.minimum(k, core.masks_left(x, zeros, hi, mask_id)) > 0)
        if can.size == 0:
            continue
        c0, c1 = P - int(plen[can].max()), P + int(width[can].max())
        sub = np.ascontiguousarray(x[can, c0:c1])
        sub_real = real[can, c0:c1]
        mask = None if bool(sub_real.all()) else np.ascontiguousarray(sub_real)
        seed = int(ctx.rng.integers(2**63 - 1)) if ctx.config.temperature > 0 else None
        out = ctx.backend.step(sub, mask, ctx.config.temperature, seed)
        x0, confidence = _compact(out, sub.shape)
        if ctx.config.remasking == "random":
            confidence = ctx.rng.random(sub.shape, dtype=np.float32)
        core.commit_step(sub, x0, confidence, np.zeros(can.size, np.int64), hi[can] - c0, k[can], mask_id)
        x[can, c0:c1] = sub
        result.steps_run += 1
        result.tokens_processed += int(sub_real.sum())
        result.positions_computed += sub.size
    for i, b in enumerate(rows):
        result.tokens[b, : kept[i]] = x[i, P : P + kept[i]]


def _compact(out: StepOutput, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The backend's token ids and confidences as the core wants them (int64 / float32, C-contiguous)."""
    if out.token_ids.shape != shape or out.confidence.shape != shape:
        raise ConfigError(
            f"the backend returned token_ids {out.token_ids.shape} and confidence {out.confidence.shape} for an input "
            f"of {shape}; it does not follow the Backend interface"
        )
    return np.ascontiguousarray(out.token_ids, dtype=np.int64), np.ascontiguousarray(out.confidence, dtype=np.float32)
