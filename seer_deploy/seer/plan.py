"""The truncation plan: from a detected boundary to the kept length and the steps that remain.

Step zero is the first denoising step of the loop, run at full length; its commits inside the kept part stand and
the rest of the loop runs on prompt + kept length only. The step budget shrinks in proportion, keeping the tokens
committed per step: whole blocks keep their steps, blocks past the cut are dropped, and a partial block of r of
its B slots gets ceil(steps_per_block * r / B) steps. The cut tail is EOS in the output.

With `SeerConfig.tail_context`, the first `context` cut slots stay in the later steps' input as committed EOS (never
decoded, past every block): the steps are still the cut's, each one runs on prompt + kept + context.

Every loop (the torch reference, the numpy runtime) takes its decisions from here and only applies them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seer_deploy.core.backend import Step0Output
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds, steps_per_block
from seer_deploy.core.sparsity import SparsityRow
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.detect import Boundary, detect
from seer_deploy.seer.response_profile import profiles_from_step0


@dataclass(frozen=True)
class BlockPlan:
    """One semi-autoregressive block in response coordinates [start, end) and the forward passes it gets."""

    start: int
    end: int
    steps: int


@dataclass(frozen=True)
class TruncationPlan:
    """What the loop does for one request after step zero."""

    gen_length: int
    kept: int  # response slots kept; positions kept..gen_length-1 are EOS in the output
    blocks: tuple[BlockPlan, ...]  # blocks[0].steps includes step zero
    full_steps: int  # the loop's steps at full length
    boundary: Boundary | None = None
    context: int = 0  # cut slots the later steps still run, as committed EOS (SeerConfig.tail_context)

    def __post_init__(self) -> None:
        if not 0 <= self.context <= self.gen_length - self.kept:
            raise ConfigError(f"tail context {self.context} does not fit the {self.gen_length - self.kept} cut slots")

    @property
    def width(self) -> int:
        """Response slots in the later steps' input: the kept ones and the committed EOS context after them."""
        return self.kept + self.context

    @property
    def steps(self) -> int:
        """Forward passes for this request, step zero included."""
        return sum(b.steps for b in self.blocks)

    @property
    def truncated(self) -> bool:
        return self.kept < self.gen_length

    def tokens_processed(self, prompt_len: int, passes_per_step: int = 1, steps: int | None = None) -> int:
        """Real tokens run through the model: step zero at full length, the other steps (the plan's, or `steps`) at
        prompt + kept + context."""
        rest = ((self.steps if steps is None else steps) - 1) * (prompt_len + self.width)
        return passes_per_step * (prompt_len + self.gen_length + rest)

    def full_tokens_processed(self, prompt_len: int, passes_per_step: int = 1) -> int:
        """What the same request costs without Seer."""
        return passes_per_step * self.full_steps * (prompt_len + self.gen_length)


def kept_length(boundary: int | None, margin: int, gen_length: int, buckets: tuple[int, ...] = ()) -> int:
    """boundary + margin, rounded up to the smallest bucket that fits, never above gen_length; None keeps all."""
    if boundary is None:
        return gen_length
    if not 1 <= boundary <= gen_length:
        raise ConfigError(f"boundary {boundary} lies outside the response [1, {gen_length}]")
    kept = min(gen_length, boundary + margin)
    if not buckets:
        return kept
    fitting = [b for b in buckets if b >= kept]
    return min(gen_length, fitting[0]) if fitting else gen_length



def block_plan(gen_length: int, steps: int, block_length: int | None, kept: int) -> tuple[BlockPlan, ...]:
    """The blocks that survive a cut at `kept`, with their step budgets (same tokens per step as full length)."""
    if not 1 <= kept <= gen_length:
        raise ConfigError(f"kept length {kept} lies outside [1, gen_length {gen_length}]")
    block, per_block = steps_per_block(gen_length, steps, block_length)
    plans = []
    for start in range(0, kept, block):
        end = min(start + block, kept)
        plans.append(BlockPlan(start, end, max(1, math.ceil(per_block * (end - start) / block))))
    return tuple(plans)


def full_length_plan(gen_length: int, steps: int, block_length: int | None) -> TruncationPlan:
    """The plan of a request that Seer does not cut: every block with its even share of the steps."""
    return TruncationPlan(gen_length=gen_length, kept=gen_length,
                          blocks=block_plan(gen_length, steps, block_length, gen_length), full_steps=steps)


def make_plan(
    gen_length: int,
    steps: int,
    block_length: int | None,
    kept: int,
    *,
    still_masked: np.ndarray | None = None,
    boundary: Boundary | None = None,
    context: int = 0,
) -> TruncationPlan:
    """The plan for a request kept at `kept` slots (and `context` committed EOS slots in view after them).

    still_masked: bool [gen_length], the response positions still masked after step zero. If the proportional
    budget leaves step zero alone in a shortened first block while masks remain there, the block gets one more step
    so every kept position is decided by the model.
    """
    blocks = block_plan(gen_length, steps, block_length, kept)
    first = blocks[0]
    if still_masked is not None and bool(np.any(still_masked[first.start : first.end])) and first.steps < 2:
        blocks = (BlockPlan(first.start, first.end, 2), *blocks[1:])
    return TruncationPlan(
        gen_length=gen_length, kept=kept, blocks=blocks, full_steps=steps, boundary=boundary, context=context
    )




def plan_batch(
    step0: Step0Output,
    rows: list[SparsityRow],
    prompt_width: int,
    responses: np.ndarray,
    config: GenerationConfig,
    ids: SpecialIds,
    *,
    seer: SeerConfig | None,
    kept_lengths: Sequence[int] | None = None,
) -> list[TruncationPlan]:
    """Plan every request of a batch from its step-zero output (left-padded to `prompt_width`), for the response
    `config` schedules (gen_length, steps, blocks).

    responses: int64 [B, gen_length], the response slots after step zero's commits. kept_lengths forces the kept
    length per request (oracle studies); the detector still runs when `seer` is given, for the report, and the tail
    context is the config's (0 without one).
    """
    gen_length, steps, block_length, eos_id, mask_id = (config.gen_length, config.steps, config.block_length, ids.eos,
                                                        ids.mask)
    B = responses.shape[0]
    if kept_lengths is not None and (len(kept_lengths) != B or any(not 1 <= k <= gen_length for k in kept_lengths)):
        raise ConfigError(f"kept_lengths must give one length in [1, {gen_length}] per prompt ({B} prompts)")
    if seer is None and kept_lengths is None:
        raise ConfigError("plan_batch needs a Seer config or forced kept lengths")
    profiles = profiles_from_step0(step0, rows, prompt_width, gen_length) if seer is not None else None
    plans = []
    for b in range(B):
        boundary = detect(profiles[b], seer, eos_id) if profiles is not None and seer is not None else None
        if kept_lengths is not None:
            kept = int(kept_lengths[b])
        else:
            assert seer is not None and boundary is not None
            kept = kept_length(boundary.position, seer.margin, gen_length, seer.buckets)
        still = responses[b] == mask_id
        plans.append(make_plan(gen_length, steps, block_length, kept, still_masked=still, boundary=boundary,
                               context=seer.context_slots(kept, gen_length) if seer is not None else 0))
    return plans


def group_rows(plans: Sequence[TruncationPlan]) -> list[tuple[tuple[BlockPlan, ...], list[int]]]:
    """Rows with the same blocks and context run together (shortest kept length first); each group pads only to its
    own length."""
    groups: dict[tuple[tuple[BlockPlan, ...], int], list[int]] = {}
    for b, plan in enumerate(plans):
        groups.setdefault((plan.blocks, plan.context), []).append(b)
    ordered = sorted(groups.items(), key=lambda item: (item[0][0][-1].end, item[0][1], item[1][0]))
    return [(blocks, rows) for (blocks, _), rows in ordered]


@dataclass(frozen=True)
class SeerReport:
    """What Seer did for one request, next to what full length would have cost."""

    detector: str | None  # None when the kept length was forced (oracle runs)
    boundary: int | None  # detected first tail position, None = no clear boundary
    confidence: float
    kept: int
    gen_length: int
    passes: int  # forward passes for this request, step zero included (parallel decoding: those it made)
    full_passes: int  # the fixed schedule's passes at full length
    tokens_processed: int
    full_tokens_processed: int
    context: int = 0  # cut slots the later steps ran as committed EOS (tail_context)

    @classmethod
    def from_plan(cls, plan: TruncationPlan, prompt_len: int, passes_per_step: int = 1, forced: bool = False,
                  passes: int | None = None) -> SeerReport:
        """passes: the passes the request made, where they are not the plan's (parallel decoding)."""
        b = plan.boundary
        made = plan.steps if passes is None else passes
        return cls(
            detector=None if forced or b is None else b.detector,
            boundary=None if b is None else b.position,
            confidence=0.0 if b is None else b.confidence,
            kept=plan.kept,
            gen_length=plan.gen_length,
            passes=made,
            full_passes=plan.full_steps,
            tokens_processed=plan.tokens_processed(prompt_len, passes_per_step, made),
            full_tokens_processed=plan.full_tokens_processed(prompt_len, passes_per_step),
            context=plan.context,
        )
