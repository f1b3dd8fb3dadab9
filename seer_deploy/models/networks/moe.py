"""The mixture-of-experts MLP of LLaDA-MoE (OLMoE-style): a softmax router picks the top-k of E SwiGLU experts per
position, and the output is the router-weighted sum of those experts' outputs (weights renormalised to sum to 1 only
with norm_topk_prob; LLaDA-MoE does not).

Exportable as written: every expert runs on every position and the routing weights, zero for unselected experts,
act as a mask. That costs E / k times the expert FLOPs of a gather-by-expert kernel (8x for LLaDA-MoE's 64 experts,
top 8): correct and simple to trace, not yet fast. The sparsity statistics cover the selected experts' units
(models.networks.mlp_stats).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.mlp_stats import moe_statistics, statistics_when


class Expert(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The expert's output, its hidden silu(gate(x)) * up(x) and activated gate silu(gate(x))."""
        a = F.silu(self.gate(x))
        h = a * self.up(x)
        return self.down(h), h, a


class MoEMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.experts_per_token, cfg.norm_topk_prob
        self.router = nn.Linear(cfg.d_model, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(cfg.d_model, cfg.mlp_hidden) for _ in range(cfg.num_experts))

    def routing(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Dense routing weights [B, S, E] (zero for the unselected experts) and the selection mask (1.0 / 0.0)."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        top_w, top_i = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(-1, top_i, top_w)
        selected = torch.zeros_like(probs).scatter(-1, top_i, torch.ones_like(top_w))
        return weights, selected

    def forward(self, x: Tensor, spec: StatsSpec | None = None, wanted: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        weights, selected = self.routing(x)
        out = torch.zeros_like(x)
        hidden, gates = [], []
        for e, expert in enumerate(self.experts):
            y, h, a = expert(x)
            out = out + weights[..., e : e + 1].to(x.dtype) * y
            if spec is not None:
                hidden.append(h)
                gates.append(a)
        if spec is None:
            return out, None

        def compute(h: Tensor, a: Tensor, selected: Tensor) -> Tensor:
            return moe_statistics(h, a, selected, spec)

        return out, statistics_when(wanted, compute, torch.stack(hidden, dim=-2), torch.stack(gates, dim=-2), selected)
