"""The commit score of a denoising step: the log-probability of the chosen token, precise near certainty.

LLaDA ranks masked positions by softmax(logits)[x0]. In float32 that probability saturates: every answer token or EOS
the model is sure of lands on one of a handful of values just under 1.0 (0.99999988, 0.99999976, ...), so the commit
order among them is decided by the last bit, and two backends whose logits differ by 1e-6 (torch and ONNX Runtime,
measured) commit different positions first. We rank by log p instead, which orders exactly as p does, computed as

    log p(x0) = (l[x0] - max) - log1p(sum over v != argmax of exp(l[v] - max))

so a near-certain prediction keeps its doubt (about 1e-7) to full float32 precision. log1p uses Kahan's formula
(u = 1 + s; s if u == 1 else log(u) * s / (u - 1)) because ONNX has no Log1p op and the exporter lowers
torch.log1p to Log(1 + s), which would round the doubt away again. Every backend and the reference call these
functions, so torch eager, the exported graphs and the loop rank with the same arithmetic.
"""

from __future__ import annotations

import torch
from torch import Tensor


def precise_log1p(s: Tensor) -> Tensor:
    """log(1 + s) for s >= 0, accurate to a few ulps for tiny s, from ops every ONNX backend runs."""
    u = 1.0 + s
    shifted = u - 1.0
    # Where u rounds to 1, log1p(s) = s to float32 precision; elsewhere log(u) corrected by s / (u - 1).
    return torch.where(shifted == 0, s, torch.log(u) * s / torch.where(shifted == 0, torch.ones_like(s), shifted))


def greedy_head(logits: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """argmax (ties: lowest id), its log-probability, the max logit and log(sum(exp(logits - max))), float32.

    The last two let `log_prob_of` score any other token (a sample, EOS) with the same arithmetic.
    """
    logits32 = logits.float()
    top, token_ids = logits32.max(dim=-1)
    shifted = torch.exp(logits32 - top[..., None])
    ids = torch.arange(logits32.shape[-1], device=logits32.device)
    # Leave the argmax's own exp(0) = 1 out of the sum, so the rest keeps its precision below float32's 1.0.
    rest = torch.where(ids == token_ids[..., None], torch.zeros_like(shifted), shifted).sum(dim=-1)
    log_total = precise_log1p(rest)
    return token_ids, -log_total, top, log_total


def log_prob_of(logits: Tensor, token_ids: Tensor, top: Tensor, log_total: Tensor) -> Tensor:
    """log softmax(logits)[token_ids] from `greedy_head`'s max and log-sum."""
    chosen = torch.gather(logits.float(), -1, token_ids[..., None]).squeeze(-1)
    return (chosen - top) - log_total


def token_log_prob(logits: Tensor, token_ids: Tensor) -> Tensor:
    """log softmax(logits)[token_ids] in float32, with `greedy_head`'s arithmetic."""
    _, _, top, log_total = greedy_head(logits)
    return log_prob_of(logits, token_ids, top, log_total)
