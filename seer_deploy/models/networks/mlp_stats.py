"""Seer's per-position sparsity statistics of an MLP's hidden h = silu(gate(x)) * up(x) (names: core.sparsity).

Dense SwiGLU MLP: over the layer's mlp_hidden units. MoE MLP (models.networks.moe): over the units of the experts the router
selected for that position (top-k experts x expert hidden units), unweighted: the router weights scale each expert's
output, not how many of its units are near zero, and the unselected experts do not run in the model being served.
Both are computed inside forward, the same code for torch and the exported step-zero graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec


def statistics_when(wanted: Tensor | None, compute: Callable[..., Tensor], h: Tensor, *operands: Tensor) -> Tensor:
    """`compute(h, *operands)`, or zeros [B, len(STAT_NAMES), S] where `wanted` (a 0-d bool tensor) is false: the
    exported step graph runs every pass, and only step zero pays for the statistics (an ONNX If; TensorRT runs it as
    a conditional). wanted None: always computed (the torch reference)."""
    if wanted is None:
        return compute(h, *operands)

    def skip(h: Tensor, *_: Tensor) -> Tensor:
        return h.new_zeros((h.shape[0], len(STAT_NAMES), h.shape[1]), dtype=torch.float32)

    return torch.cond(wanted, compute, skip, (h, *operands))


def mlp_statistics(h: Tensor, a: Tensor, spec: StatsSpec) -> Tensor:
    """Per-position sparsity statistics [B, len(STAT_NAMES), S] of the MLP hidden h and activated gate a."""
    abs_h, abs_a = h.float().abs(), a.float().abs()
    row_max = abs_h.amax(dim=-1, keepdim=True)
    frac_h = (abs_h < spec.abs_threshold).float().mean(-1)
    frac_a = (abs_a < spec.abs_threshold).float().mean(-1)
    frac_rel = (abs_h < spec.rel_threshold * row_max).float().mean(-1)
    return torch.stack([frac_h, frac_a, frac_rel, abs_h.mean(-1)], dim=1)


def moe_statistics(h: Tensor, a: Tensor, selected: Tensor, spec: StatsSpec) -> Tensor:
    """The same statistics [B, len(STAT_NAMES), S] over the selected experts' units only.

    h, a: [B, S, E, I] every expert's hidden and activated gate (the exportable MoE runs them all);
    selected: [B, S, E] 1.0 where the router chose the expert for the position, else 0.0 (k ones per position)."""
    abs_h, abs_a = h.float().abs(), a.float().abs()
    sel = selected.float()
    units = sel.sum(-1) * h.shape[-1]  # k * I per position

    def share(near_zero: Tensor) -> Tensor:
        return (near_zero.float().sum(-1) * sel).sum(-1) / units

    row_max = (abs_h.amax(dim=-1) * sel).amax(dim=-1)[..., None, None]  # over the selected experts' units
    mean_abs = (abs_h.sum(-1) * sel).sum(-1) / units
    stats = [share(abs_h < spec.abs_threshold), share(abs_a < spec.abs_threshold),
             share(abs_h < spec.rel_threshold * row_max), mean_abs]
    return torch.stack(stats, dim=1)
