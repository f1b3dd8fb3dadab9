"""Hybrid batched execution after Seer's cut: which rows of a batch run together.

After step zero every row has its own kept length and block plan. Rows with the same plan form a unit
(`seer.plan.group_rows`, shortest kept length first). Running neighbouring units merged saves forward passes but
pads the shorter rows to the longer kept length; running them apart saves the padded tokens. A cost model of one
forward pass, `a + b * batch * seq_len`, simulated over the steps that remain, chooses the cheapest split of the
units into contiguous groups (`plan_hybrid`, a small dynamic program; pure, so it is tested on its own). Running a
group is the executor's (`runtime.executor.run_group`): each row keeps its own schedule, so its tokens are those of
its solo run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from seer_deploy.core.backend import Backend, StepInput
from seer_deploy.core.errors import ConfigError
from seer_deploy.seer.plan import TruncationPlan, group_rows

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




# ---------------------------------------------------------------- the cost of a backend



def step_cost_of(backend: Backend) -> StepCost:
    """The backend's own StepCost when it carries one (a `step_cost` attribute, e.g. measured by
    `measure_step_cost`), else the default."""
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
        backend.step(StepInput(ids))  # warm-up: first calls allocate
        best = float("inf")
        for _ in range(repeats):
            start = clock()
            backend.step(StepInput(ids))
            best = min(best, clock() - start)
        sizes.append(ids.size)
        seconds.append(best)
    b, a = np.polyfit(np.asarray(sizes, dtype=np.float64), np.asarray(seconds, dtype=np.float64), 1)
    return StepCost(a=max(float(a), 0.0), b=max(float(b), 1e-12))
