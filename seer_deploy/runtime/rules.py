"""The Dream family's sampler in the runtime loop (core.decoding): how many masks each step commits, and which.

A row runs its plan's one block of `steps` passes (step zero is pass 0). Before each pass the row's `RuleCursor`
turns the masks it has left into the pass's count (`StepCount`), in the loop core:
  * timesteps (Dream): k = int(masks * (1 - t[i+1] / t[i])), every mask at the last pass
    (`timestep_transfer`); a pass that would commit none is not run (the authors run it and change nothing);
  * confident (Dimple): the masks scoring above the threshold, else `reanchored_transfer`'s count; every mask at
    the last pass; a row with no mask left is done.
After the pass `commit_rule` commits: the top k by the rule's score (`commit_step`), every mask above the threshold
(`commit_above`), `origin`'s independent draws (each mask with probability 1 - s / t: host uniforms u, committed
where u < 1 - s / t), or with alg_temp > 0 positions drawn from softmax(score / alg_temp) without replacement
(torch.multinomial's own method: the top k of p / q, q exponential draws). Host draws come from the loop's RNG, one
uniform per mask of the row in column order, rows in order, so a transcription that draws from the same generator
gets the same positions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from seer_deploy.core.backend import PassOutput
from seer_deploy.core.decoding import ScoreRule, step_ratio, timesteps
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.runtime.loopcore import LoopCore


class StepCount(NamedTuple):
    """What one pass of a row commits: `number` top-ranked masks, or (`above`) every mask above the threshold with
    `number` as the fallback; `ratio` is origin's probability 1 - s / t."""

    number: int
    above: bool = False
    ratio: float = 1.0


def pass_count(core: LoopCore, config: GenerationConfig, masks: int, total: int, index: int, steps: int
               ) -> StepCount:
    """The count of pass `index` of `steps` for a row with `masks` masks left of the `total` it started with."""
    if masks == 0:
        return StepCount(0)
    if index >= steps - 1:
        return StepCount(masks)
    if config.decode == "confident":
        row = np.ascontiguousarray(timesteps(steps, config.eps)[None, :])
        fallback = core.reanchored_transfer(np.array([masks]), np.array([total]), np.array([index]), row,
                                            np.array([steps]))
        return StepCount(int(fallback[0]), above=True)
    ratio = step_ratio(steps, config.eps, index)
    if config.remasking == "origin":
        return StepCount(masks, ratio=float(ratio))  # the draws decide; run the pass
    return StepCount(int(core.timestep_transfer(np.array([masks]), np.array([ratio], np.float32))[0]))


class RuleCursor:
    """Where one row is in its block: the pass it makes next and what that pass commits."""

    def __init__(self, steps: int, total: int, index: int = 1) -> None:
        self.steps = steps  # the rule's passes (its plan's one block), step zero included unless it was a prompt pass
        self.total = total  # masks at the rule's start (prompt masks + kept slots): Dimple's re-anchoring base
        self.index = index  # the next pass: 1 after step zero; 0 after LaViDa-Dream's prompt pass

    def next(self, core: LoopCore, config: GenerationConfig, masks: int) -> StepCount | None:
        """The next pass's count, or None when the row is done (its passes run out, or no mask is left)."""
        if self.index >= self.steps or masks == 0:
            return None
        self.index += 1
        return pass_count(core, config, masks, self.total, self.index - 1, self.steps)


def rule_cursor(config: GenerationConfig, steps: int, kept: int, prompt_masks: int) -> RuleCursor:
    """A row's cursor after step zero: its plan's `steps` over `kept` slots; after LaViDa-Dream's prompt pass (which
    committed the first answer token) all of them follow over the other masks, at most one a slot as LaViDa's
    min(steps, max_new_tokens)."""
    if config.first_from_prompt:
        return RuleCursor(min(steps, kept), prompt_masks + kept - 1, index=0)
    return RuleCursor(steps, prompt_masks + kept)


def mask_uniforms(rng: np.random.Generator, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, mask_id: int
                  ) -> np.ndarray:
    """float32 [B, S]: one uniform in [0, 1) per mask of [lo[b], hi[b]) (rows in order, columns in order), 1 elsewhere."""
    out = np.ones(x.shape, dtype=np.float32)
    for b in range(x.shape[0]):
        columns = lo[b] + np.flatnonzero(x[b, lo[b] : hi[b]] == mask_id)
        out[b, columns] = rng.random(columns.size, dtype=np.float32)
    return out


def drawn_keys(rng: np.random.Generator, x: np.ndarray, score: np.ndarray, rule: ScoreRule, alg_temp: float,
               lo: np.ndarray, hi: np.ndarray, mask_id: int) -> np.ndarray:
    """float32 [B, S]: keys whose top k are k positions drawn from softmax(score / alg_temp) over each row's masks
    without replacement: p / q with q = -log(u) exponential (what torch.multinomial does without replacement)."""
    values = np.exp(score) if rule == ScoreRule.PROBABILITY else score  # the rule's own units (p, not log p)
    u = mask_uniforms(rng, x, lo, hi, mask_id)
    keys = np.zeros(x.shape, dtype=np.float32)
    for b in range(x.shape[0]):
        columns = lo[b] + np.flatnonzero(x[b, lo[b] : hi[b]] == mask_id)
        if columns.size:
            z = (values[b, columns] / np.float32(alg_temp)).astype(np.float32)
            p = np.exp(z - z.max()).astype(np.float32)
            keys[b, columns] = (p / p.sum(dtype=np.float32)) / -np.log(u[b, columns])
    return keys


def commit_rule(core: LoopCore, config: GenerationConfig, rng: np.random.Generator, mask_id: int, x: np.ndarray,
                out: PassOutput, span: tuple[np.ndarray, np.ndarray],
                counts: list[StepCount]) -> None:
    """Commit, in place, what each row's StepCount asks for among its masks of [lo[b], hi[b]) (`span` = lo, hi)."""
    lo, hi = span
    x0 = np.ascontiguousarray(out.token_ids, dtype=np.int64)
    scores = getattr(out, "score", None)  # a refresh returns none
    score = np.ascontiguousarray(out.confidence if scores is None else scores, dtype=np.float32)
    k = np.array([c.number for c in counts], np.int64)
    above = np.array([c.above for c in counts])
    scoring = config.scoring()
    assert scoring is not None
    if above.any():
        limit = np.log(config.threshold) if scoring.rule == ScoreRule.PROBABILITY else config.threshold
        threshold = np.where(above, np.float32(limit), np.float32(np.inf)).astype(np.float32)
        committed = core.commit_above(x, x0, score, lo, hi, threshold, mask_id)
        k = np.where(above & (committed > 0), 0, k)
    if config.remasking == "origin" and config.decode == "timesteps":
        ratio = np.array([c.ratio for c in counts], np.float32)
        u = mask_uniforms(rng, x, lo, hi, mask_id)
        core.commit_above(x, x0, -u, lo, hi, -ratio, mask_id)
        return
    if config.remasking == "origin":  # Dimple's fallback for origin: that many masks at random
        keys = mask_uniforms(rng, x, lo, hi, mask_id)
    elif config.alg_temp > 0:
        keys = drawn_keys(rng, x, score, scoring.rule, config.alg_temp, lo, hi, mask_id)
    else:
        keys = score
    core.commit_step(x, x0, keys, lo, hi, k, mask_id)
