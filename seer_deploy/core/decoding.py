"""The Dream family's decoding rules as data: how many masks a step commits, and what it ranks them by.

LLaDA's rules (`GenerationConfig.decode` fixed / threshold / factor, `remasking` low_confidence / random) split the
response into blocks. Dream, Dimple and LaViDa-Dream decode as their authors' `generation_utils.py` does (Dream's
`diffusion_generate`; Dimple's `decoding_pipeline="dim"`), one block over the whole response:

* `decode="timesteps"` (Dream): timesteps t = linspace(1, eps, steps + 1); step i commits int(masks * (1 - t[i+1] /
  t[i])) of the masks left (all of them at the last step), the most confident first (`remasking` below);
* `decode="confident"` (Dimple's confident decoding): step i commits every mask whose score is above `threshold`
  (all at the last step); where none is, the schedule re-anchored at the current mask ratio r = masks / masks at
  the start: the first later timestep s < r that commits at least one, int(masks * (1 - s / r));
  the loop stops when no mask is left.

`remasking` names the score (Dream's `alg`): `maskgit_plus` the chosen token's probability, `topk_margin` the top-1
minus the top-2 probability, `entropy` sum p log(p + 1e-10) (negative entropy), each over softmax(logits /
temperature) after top-p / top-k (Dream); Dimple's confident decoding takes them from the untouched softmax(logits)
(its `use_original_confidence`). `origin` commits each mask with probability 1 - s / t instead (Dream; Dimple's
fallback takes that many at random). `alg_temp` > 0 draws the committed positions from softmax(score / alg_temp)
without replacement instead of taking the top ones.

The numbers follow the authors' float32 arithmetic exactly: `timesteps` are torch.linspace's float32 values (a fused
multiply-add per element, as its CPU and CUDA kernels compute them), the counts are taken in float32 by the loop
core (`runtime.loopcore.timestep_transfer`, `reanchored_transfer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

import numpy as np

from seer_deploy.core.checks import int_in, number_in
from seer_deploy.core.decoding_names import DREAM_DECODES, DREAM_REMASKING
from seer_deploy.core.errors import ConfigError

ENTROPY_EPSILON = 1e-10  # Dream's and Dimple's log(p + 1e-10)


class ScoreRule(IntEnum):
    """What the step graph's head scores a candidate by (its `score_rule` input, one per batch row)."""

    PROBABILITY = 0  # log p(token): ranks as p does; the confidence output is this rule at temperature 1
    MARGIN = 1  # top-1 minus top-2 probability
    NEG_ENTROPY = 2  # sum p log(p + 1e-10)


SCORE_RULES = {"maskgit_plus": ScoreRule.PROBABILITY, "origin": ScoreRule.PROBABILITY,
               "topk_margin": ScoreRule.MARGIN, "entropy": ScoreRule.NEG_ENTROPY}


@dataclass(frozen=True)
class Scoring:
    """How a pass picks and scores its candidates under a Dream-family rule. Tokens are drawn from
    softmax(logits / T) after top-p / top-k (T: the pass's temperature; 0 = argmax); the score is taken from the
    same filtered softmax at `temperature` (Dream), or with `original` from the untouched softmax(logits) (Dimple's
    use_original_confidence). LLaDA's rules need no Scoring: their confidence output is the score."""

    rule: ScoreRule
    temperature: float = 1.0  # the score's softmax(logits / temperature); 1 where the pass is greedy
    top_p: float | None = None
    top_k: int | None = None
    original: bool = False

    @property
    def filtered(self) -> bool:
        """Whether top-p / top-k change the tokens or scores (only backends with the full logits run that)."""
        return (self.top_p is not None and self.top_p < 1) or self.top_k is not None


@lru_cache(maxsize=64)
def timesteps(steps: int, eps: float) -> np.ndarray:
    """float32 [steps + 1]: torch.linspace(1, eps, steps + 1)'s values: step = (eps - 1) / steps in float32, the
    first half start + step * i and the second end - step * (n - 1 - i), each a fused multiply-add rounded once
    (float64 holds the product exactly). Read-only: cached."""
    n = steps + 1
    start, end = np.float32(1.0), np.float32(eps)
    step = np.float64(np.float32((end - start) / np.float32(steps)))
    i = np.arange(n, dtype=np.float64)
    first = (np.float64(start) + step * i).astype(np.float32)
    second = (np.float64(end) - step * (n - 1 - i)).astype(np.float32)
    values = np.where(np.arange(n) < n // 2, first, second).astype(np.float32)
    values.flags.writeable = False
    return values


def step_ratio(steps: int, eps: float, index: int) -> np.float32:
    """float32 1 - t[index + 1] / t[index], the share of the masks Dream's step `index` commits; 1 at the last step
    (it commits every mask left)."""
    if index >= steps - 1:
        return np.float32(1.0)
    t = timesteps(steps, eps)
    return np.float32(np.float32(1.0) - t[index + 1] / t[index])


def check_rule(decode: str, remasking: str, eps: float, alg_temp: float, top_p: float | None,
               top_k: int | None, block_length: int | None, gen_length: int) -> None:
    """ConfigError naming a setting that no loop runs: Dream's scores with LLaDA's schedules or the other way round,
    blocks under Dream's sampler, eps outside (0, 1), alg_temp < 0, top_p outside (0, 1], top_k < 1."""
    dream = decode in DREAM_DECODES
    if dream and remasking not in DREAM_REMASKING:
        raise ConfigError(f"--decode {decode} (the Dream family's sampler) ranks by {', '.join(DREAM_REMASKING)}; "
                          f"--remasking {remasking} is LLaDA's: choose one of those")
    if not dream and remasking in DREAM_REMASKING:
        raise ConfigError(f"--remasking {remasking} is a rule of the Dream family's sampler; use it with --decode "
                          f"timesteps or confident, or choose --remasking low_confidence / random")
    if dream and block_length not in (None, gen_length):
        raise ConfigError(f"--decode {decode} has no blocks (the Dream family's sampler runs the whole response); "
                          "drop --block-length")
    if not number_in(eps, 0.0, 1.0) or eps in (0.0, 1.0):
        raise ConfigError(f"eps is {eps!r}; it must be a number in (0, 1) (--eps; Dream's default is 1e-3)")
    if not number_in(alg_temp, 0.0, 1e6):
        raise ConfigError(f"alg_temp is {alg_temp!r}; it must be a finite number >= 0 (--alg-temp; 0 takes the top "
                          "scores)")
    if top_p is not None and (not number_in(top_p, 0.0, 1.0) or top_p == 0):
        raise ConfigError(f"top_p is {top_p!r}; it must be a probability in (0, 1] (--top-p)")
    if top_k is not None and not int_in(top_k, 1, 1 << 31):
        raise ConfigError(f"top_k is {top_k!r}; it must be an integer >= 1 (--top-k)")
    if not dream and (alg_temp > 0 or top_p is not None or top_k is not None):
        raise ConfigError("--alg-temp, --top-p and --top-k belong to the Dream family's sampler; use them with "
                          "--decode timesteps or confident")
