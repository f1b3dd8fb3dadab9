"""The Dream family's commit scores from logits, in torch: one arithmetic for the torch backend, the reference loop
and the exported step graph's head (core.decoding names the rules).

Per candidate, from probabilities p = softmax(logits / temperature):
  * PROBABILITY: log p(token), with `models.networks.confidence`'s precise arithmetic (it ranks as p does);
  * MARGIN: the top-1 minus the top-2 probability (Dream's `topk_margin`);
  * NEG_ENTROPY: sum p log(p + 1e-10) (Dream's `entropy`, epsilon included).
`nucleus` and `top_k_filter` are Dream's top_p_logits / top_k_logits (filtered logits set to the dtype's lowest
value, so their probability is exactly 0); exported graphs do not run them (they would need a vocabulary sort).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seer_deploy.core.decoding import ENTROPY_EPSILON, ScoreRule
from seer_deploy.models.networks.confidence import token_log_prob


def nucleus(logits: Tensor, top_p: float) -> Tensor:
    """Keep the most probable tokens whose probability before them sums to at most top_p (the first always)."""
    ordered, order = torch.sort(logits, dim=-1, descending=True)
    cumulative = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1)
    drop = torch.zeros_like(cumulative, dtype=torch.bool)
    drop[..., 1:] = cumulative[..., :-1] > top_p
    removed = torch.zeros_like(drop).scatter(-1, order, drop)
    return logits.masked_fill(removed, torch.finfo(logits.dtype).min)


def top_k_filter(logits: Tensor, top_k: int) -> Tensor:
    """Keep the tokens whose logit is at least the k-th largest."""
    kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def filtered(logits: Tensor, temperature: float, top_p: float | None, top_k: int | None) -> Tensor:
    """Dream's order: logits / temperature (when > 0), then top-p, then top-k; float32."""
    out = logits.float()
    if temperature > 0:
        out = out / temperature
    if top_p is not None and top_p < 1:
        out = nucleus(out, top_p)
    if top_k is not None:
        out = top_k_filter(out, top_k)
    return out


def margin_and_entropy(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The top-1 minus top-2 probability and sum p log(p + 1e-10), float32, over the last axis."""
    probs = torch.softmax(logits.float(), dim=-1)
    top2 = torch.topk(probs, 2, dim=-1).values
    return top2[..., 0] - top2[..., 1], (probs * torch.log(probs + ENTROPY_EPSILON)).sum(dim=-1)


def rule_score(logits: Tensor, token_ids: Tensor, rule: Tensor, temperature: Tensor) -> Tensor:
    """float32 [B, C]: row b's rule (int64 [B], ScoreRule) over softmax(logits / temperature[b]) (logits [B, C, V],
    tokens [B, C])."""
    scaled = logits.float() / temperature.float()[:, None, None]
    margin, neg_entropy = margin_and_entropy(scaled)
    log_p = token_log_prob(scaled, token_ids)
    by_rule = rule[:, None]
    return torch.where(by_rule == int(ScoreRule.MARGIN), margin,
                       torch.where(by_rule == int(ScoreRule.NEG_ENTROPY), neg_entropy, log_p))
