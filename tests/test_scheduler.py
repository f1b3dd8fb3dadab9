"""The batch scheduler: the cost model's decisions, and hybrid execution giving every row its solo tokens."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import tiny_model

from seer_deploy.core.backend import Backend, Step0Output, StepInput, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.runtime.executor import StepSlot, step_slots
from seer_deploy.runtime.loop import LoopOptions, run_generation
from seer_deploy.runtime.loopcore import c_core, core_name, python_core
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.scheduler import (
    RowWork,
    StepCost,
    group_cost,
    measure_step_cost,
    plan_hybrid,
    split_units,
    step_cost_of,
)
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.plan import BlockPlan, make_plan

CORES = [python_core()] + ([c_core()] if c_core() is not None else [])
with_cores = pytest.mark.parametrize("core", CORES, ids=lambda c: core_name(c))
MERGE_ALL = StepCost(a=1.0, b=1e-9)  # calls are all that matter: one group
APART = StepCost(a=0.0, b=1.0)  # padding is all that matters: every unit alone


# ---------------------------------------------------------------- the cost model (pure)


def test_group_cost_counts_the_rows_still_running_at_each_step() -> None:
    a, b = 3.0, 0.5
    cost = StepCost(a, b)
    short, long = RowWork(prompt_len=4, width=8, steps=8), RowWork(prompt_len=6, width=16, steps=16)
    # Together: 8 steps of both rows at width 6 + 16, then 8 steps of the long row alone at the same width.
    assert group_cost([short, long], cost) == pytest.approx(8 * (a + b * 2 * 22) + 8 * (a + b * 22))
    assert group_cost([short], cost) == pytest.approx(8 * (a + b * 12))
    assert group_cost([], cost) == 0.0


def test_merging_flips_where_the_saved_calls_outweigh_the_padding() -> None:
    # short (p 4, kept 8, 8 steps) and long (p 4, kept 16, 16 steps):
    # merged - apart = 8 * (a + 2b * 20) + 8 * (a + b * 20) - 8 * (a + b * 12) - 16 * (a + b * 20) = 64b - 8a.
    units = [[RowWork(4, 8, 8)], [RowWork(4, 16, 16)]]
    assert split_units(units, StepCost(a=7.0, b=1.0)) == [(0, 1), (1, 2)]
    assert split_units(units, StepCost(a=9.0, b=1.0)) == [(0, 2)]
    assert split_units(units, StepCost(a=8.0, b=1.0)) == [(0, 2)]  # a tie: fewer calls


def test_only_neighbours_merge_and_the_split_is_the_cheapest() -> None:
    units = [[RowWork(4, 8, 8)], [RowWork(4, 9, 9)], [RowWork(4, 60, 60)], [RowWork(4, 62, 62)]]
    cost = StepCost(a=20.0, b=1.0)
    runs = split_units(units, cost)
    assert runs == [(0, 2), (2, 4)]  # the two short rows together, the two long ones together
    every = [[(0, 1), (1, 2), (2, 3), (3, 4)], [(0, 4)], [(0, 2), (2, 3), (3, 4)], [(0, 1), (1, 4)]]
    best = sum(group_cost([r for u in units[i:j] for r in u], cost) for i, j in runs)
    for split in every:
        assert best <= sum(group_cost([r for u in units[i:j] for r in u], cost) for i, j in split)


def test_plan_hybrid_keeps_equal_plans_together_and_covers_every_row() -> None:
    plans = [make_plan(16, 16, None, k) for k in (4, 16, 4, 9, 16)]
    lens = [5, 3, 7, 4, 6]
    apart = plan_hybrid(plans, lens, APART)
    assert apart.groups == ((0, 2), (3,), (1, 4))  # units of equal plans, shortest kept first
    merged = plan_hybrid(plans, lens, MERGE_ALL)
    assert merged.groups == ((0, 1, 2, 3, 4),)
    assert merged.cost == merged.merged_cost < merged.apart_cost
    assert apart.cost == apart.apart_cost < apart.merged_cost
    with pytest.raises(ConfigError, match="one plan per row"):
        plan_hybrid(plans, lens[:2], APART)


def test_step_slots_follow_the_blocks_after_step_zero() -> None:
    slots = step_slots((BlockPlan(0, 4, 3), BlockPlan(4, 6, 2)))
    assert slots == (
        StepSlot(0, 4, 0, 2, True), StepSlot(0, 4, 1, 2, True), StepSlot(4, 6, 0, 2, False), StepSlot(4, 6, 1, 2, False)
    )
    assert step_slots((BlockPlan(0, 4, 1),)) == ()  # step zero was the block's only step


def test_step_cost_validation_and_the_backend_cost() -> None:
    with pytest.raises(ConfigError, match="b > 0"):
        StepCost(a=0.0, b=0.0)
    with pytest.raises(ConfigError, match="a >= 0"):
        StepCost(a=-1.0, b=1.0)
    backend = TorchBackend(tiny_model())
    assert step_cost_of(backend) == StepCost()
    backend.step_cost = StepCost(a=2.0, b=3.0)  # type: ignore[attr-defined]  # a backend that carries its measured cost
    assert step_cost_of(backend) == StepCost(a=2.0, b=3.0)


class ClockedBackend:
    """A backend whose step advances a fake clock by a + b * B * S: measure_step_cost must recover a and b."""

    name = "clocked"
    max_seq_len = 128
    def __init__(self, a: float, b: float) -> None:
        self.a, self.b, self.now = a, b, 0.0
        self.sparsity_rows: list[tuple[int, str]] = []

    def clock(self) -> float:
        return self.now

    def step0(self, inputs: StepInput) -> Step0Output:
        raise AssertionError("not used")

    def step(self, inputs: StepInput) -> StepOutput:
        ids = inputs.input_ids
        self.now += self.a + self.b * ids.size
        return StepOutput(np.zeros(ids.shape, np.int64), np.zeros(ids.shape, np.float32))


def test_measure_step_cost_fits_call_and_token_cost() -> None:
    backend = ClockedBackend(a=2e-3, b=5e-6)
    cost = measure_step_cost(backend, clock=backend.clock)
    assert cost.a == pytest.approx(2e-3, rel=1e-6) and cost.b == pytest.approx(5e-6, rel=1e-6)
    with pytest.raises(ConfigError, match="two different"):
        measure_step_cost(backend, shapes=((1, 16), (2, 8)), clock=backend.clock)


# ---------------------------------------------------------------- hybrid execution


class Recorder:
    """Wraps a backend and records the (input, mask) of every denoising step call."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name, self.max_seq_len, self.sparsity_rows = inner.name, inner.max_seq_len, inner.sparsity_rows
        self.calls: list[tuple[np.ndarray, np.ndarray | None]] = []

    def step0(self, inputs: StepInput) -> Step0Output:
        return self.inner.step0(inputs)

    def step(self, inputs: StepInput) -> StepOutput:
        mask = inputs.attention_mask
        self.calls.append((inputs.input_ids.copy(), None if mask is None else mask.copy()))
        return self.inner.step(inputs)


def right_padded_calls(calls: list[tuple[np.ndarray, np.ndarray | None]]) -> int:
    """Calls in which some row's response region ends in padding (rows of different kept lengths merged)."""
    return sum(1 for _, mask in calls if mask is not None and bool((mask[:, -1] == 0).any()))


PROMPTS = [[10, 14, 1, 2, 3, 13], [10, 15, 4, 13], [10, 16, 5, 6, 7, 8, 9, 1, 2, 13], [10, 17, 3, 13], [10, 18, 2, 13]]
MIXES = [
    ("spread", GenerationConfig(gen_length=24, steps=24), [3, 24, 9, 17, 24]),
    ("blocks", GenerationConfig(gen_length=24, steps=12, block_length=8), [5, 24, 12, 8, 20]),
    ("few steps", GenerationConfig(gen_length=16, steps=4), [2, 16, 7, 16, 11]),
]


@with_cores
@pytest.mark.parametrize("config, kept", [m[1:] for m in MIXES], ids=[m[0] for m in MIXES])
@pytest.mark.parametrize("cost", [MERGE_ALL, APART], ids=["merged", "apart"])
def test_every_row_gets_its_solo_tokens(core: Any, config: GenerationConfig, kept: list[int], cost: StepCost) -> None:
    model = tiny_model(seed=3)
    ids = {"ids": SpecialIds(model.cfg.mask_id, model.cfg.eos_id)}
    backend = Recorder(TorchBackend(model))
    batch = run_generation(backend, PROMPTS, config, options=LoopOptions(core=core, cost=cost), kept_lengths=kept, **ids)  # type: ignore[arg-type]
    for b, (prompt, k) in enumerate(zip(PROMPTS, kept, strict=True)):
        solo = run_generation(TorchBackend(model), [prompt], config, options=LoopOptions(core=core), kept_lengths=[k], **ids)  # type: ignore[arg-type]
        np.testing.assert_array_equal(batch.tokens[b], solo.tokens[0], err_msg=f"row {b} (kept {k})")
    assert (batch.tokens[0, kept[0] :] == model.cfg.eos_id).all()
    # The torch reference (rows of equal plans grouped) agrees too.
    np.testing.assert_array_equal(batch.tokens, generate(model, PROMPTS, config, kept_lengths=kept).tokens.numpy())
    if cost is MERGE_ALL:
        assert right_padded_calls(backend.calls) > 0
        # The longest rows finish last, on their own: the shorter ones have left the batch.
        assert backend.calls[-1][0].shape[0] == kept.count(max(kept)) < len(PROMPTS)
    else:
        assert right_padded_calls(backend.calls) == 0


@with_cores
def test_merging_saves_calls_and_pads_only_inside_the_group(core: Any) -> None:
    model = tiny_model(seed=4)
    config = GenerationConfig(gen_length=16, steps=16)
    ids = {"ids": SpecialIds(model.cfg.mask_id, model.cfg.eos_id)}
    kept = [4, 16, 6, 16, 5]
    runs = {}
    for name, cost in (("merged", MERGE_ALL), ("apart", APART)):
        backend = Recorder(TorchBackend(model))
        runs[name] = (run_generation(backend, PROMPTS, config, options=LoopOptions(core=core, cost=cost), kept_lengths=kept, **ids), backend)  # type: ignore[arg-type]
    merged, apart = runs["merged"], runs["apart"]
    np.testing.assert_array_equal(merged[0].tokens, apart[0].tokens)
    assert merged[0].passes < apart[0].passes
    # Real tokens are the same work either way; the merged run computes more positions (the padding).
    assert merged[0].tokens_processed == apart[0].tokens_processed
    assert sum(x.size for x, _ in merged[1].calls) > sum(x.size for x, _ in apart[1].calls)
    # Every call's real positions are exactly its rows' prompts and kept slots.
    real = sum(int(x.size if mask is None else mask.sum()) for x, mask in merged[1].calls)
    assert real == merged[0].tokens_processed - 5 * 16 - sum(len(p) for p in PROMPTS)  # minus step zero
