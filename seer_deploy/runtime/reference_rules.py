"""The Dream family's sampler in torch (core.decoding): the reference loop's passes, and the tokens and scores the torch
backend returns.

The counts are computed here in torch from torch.linspace, as the authors' loops compute them (the runtime loop uses
the loop core's float32 twins of the same expressions); positions are ranked by the rule's score with ties to the
lower position, as every loop ranks. Random rules (origin, alg_temp > 0, Dimple's random fallback) draw from the
reference's torch generator: equal in distribution to the runtime loop's host draws, not in values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seer_deploy.core.decoding import ScoreRule, Scoring
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.networks.rule_scores import filtered, rule_score


def pick_scored(logits: Tensor, temperature: float, generator: torch.Generator | None, scoring: Scoring
                ) -> tuple[Tensor, Tensor]:
    """(tokens, scores) [B, S]: the argmax, or at temperature > 0 a draw from the tempered, filtered softmax, and the
    rule's score over the softmax `scoring` names."""
    drawn = filtered(logits, temperature, scoring.top_p, scoring.top_k)
    if temperature > 0:
        flat = torch.softmax(drawn, dim=-1).reshape(-1, drawn.shape[-1])
        token = torch.multinomial(flat, 1, generator=generator).reshape(drawn.shape[:-1])
    else:
        token = drawn.argmax(-1)
    source = logits.float() if scoring.original else filtered(logits, scoring.temperature, scoring.top_p,
                                                              scoring.top_k)
    ones = torch.ones(logits.shape[0], device=logits.device)
    return token, rule_score(source, token, torch.full_like(ones, int(scoring.rule), dtype=torch.long), ones)


def _reanchored(masks: int, total: int, index: int, ts: Tensor) -> int:
    """Dimple's fallback count: the schedule re-anchored at the current mask ratio, at least one."""
    ratio = torch.tensor(masks) / torch.tensor(total)
    if masks == 0 or not bool(ratio > ts[-1]):
        return masks
    start = max(int((ts < ratio).nonzero()[0, 0]), index + 1)
    for s in ts[start:]:
        count = int(masks * (1 - s / ratio)) if bool(s > ts[-1]) else masks
        if count >= 1:
            return count
    return masks


def pass_counts(masks: Tensor, totals: Tensor, index: int, steps: int, config: GenerationConfig
                ) -> tuple[list[int], list[bool], Tensor]:
    """Per row: the count of pass `index` of `steps`, whether it is the confident rule's fallback (the masks above
    the threshold first), and origin's probability 1 - s / t."""
    ts = torch.linspace(1, config.eps, steps + 1)
    last = index >= steps - 1
    ratio = torch.tensor(1.0) if last else 1 - ts[index + 1] / ts[index]
    if last or config.remasking == "origin" and config.decode == "timesteps":
        return masks.tolist(), [False] * len(masks), ratio
    if config.decode == "confident":
        counts = [_reanchored(int(m), int(t), index, ts) for m, t in zip(masks, totals, strict=True)]
        return counts, [int(m) > 0 for m in masks], ratio
    return [int(m.float() * ratio) for m in masks], [False] * len(masks), ratio


def _top(keys: Tensor, counts: Tensor) -> Tensor:
    """Boolean [B, S]: each row's counts[b] largest keys (ties to the lower position)."""
    order = torch.sort(keys, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(keys.shape[-1]).expand_as(order))
    return ranks < counts[:, None]


def rule_commit(x: Tensor, x0: Tensor, score: Tensor, candidate: Tensor, rule: tuple[int, int, Tensor],
                config: GenerationConfig, generator: torch.Generator | None) -> Tensor:
    """x after pass `index` of `steps` commits among the candidates (masks before each row's end); `rule` = (index,
    steps, the masks each row had at the start)."""
    index, steps, totals = rule
    counts, above, ratio = pass_counts(candidate.sum(-1), totals, index, steps, config)
    k = torch.tensor(counts)
    none = torch.full_like(score, -torch.inf)
    if any(above):
        scoring = config.scoring()
        assert scoring is not None
        limit = torch.log(torch.tensor(config.threshold)) if scoring.rule == ScoreRule.PROBABILITY else config.threshold
        passing = candidate & (score > limit) & torch.tensor(above)[:, None]
        x = torch.where(passing, x0, x)
        k = torch.where(torch.tensor(above) & passing.any(-1), 0, k)
    uniform = torch.rand(x.shape, generator=generator)
    if config.remasking == "origin" and config.decode == "timesteps":
        return torch.where(candidate & (uniform < ratio), x0, x)
    if config.remasking == "origin":
        keys = uniform
    elif config.alg_temp > 0:
        values = score.exp() if config.scoring() and config.remasking == "maskgit_plus" else score
        p = torch.softmax(torch.where(candidate, values / config.alg_temp, none), dim=-1)
        keys = p / -torch.log(uniform)
    else:
        keys = score
    chosen = _top(torch.where(candidate, keys, none), k) & candidate
    return torch.where(chosen, x0, x)
