"""The LLaDA-family mask predictor: a bidirectional Llama-style transformer in one readable file.

RMSNorm, rotary embeddings (rotate-half), grouped-query attention without a causal mask, SwiGLU MLP
`down(silu(gate(x)) * up(x))`, no biases. `forward` can also return Seer's per-position MLP activation
statistics, computed inside forward (torch.export rejects hooks), so the exported step-zero graph carries them.

Block-wise KV cache (Fast-dLLM's dual cache): `forward(..., return_kv=True)` also returns every layer's keys and
values (after rotary, before the grouped-query repeat); `forward_window` runs only a window of the sequence, its
queries attending to the window's fresh keys and values and to the cached ones of every other real position.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.models.config import ModelConfig


class ModelOutput(NamedTuple):
    logits: Tensor  # [B, S, V]
    stats: Tensor | None  # [B, len(spec.layers), len(STAT_NAMES), S] in float32, or None
    kv: Tensor | None = None  # [n_layers, 2, B, n_kv_heads, S, head_dim] in float32 (return_kv), or None

KVPair = tuple[Tensor, Tensor]  # one layer's keys and values [B, n_kv_heads, S, head_dim]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


def rope_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin tables [B, 1, S, head_dim] for integer positions [B, S], in float32 (LLaDA's full-precision rope)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq  # [B, S, head_dim/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor | None, cached: KVPair | None = None
    ) -> tuple[Tensor, KVPair]:
        """The attention output and this call's own keys and values; `cached` keys and values are attended to
        before them (key_mask then covers cached + own positions)."""
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        own = (k, v)
        if cached is not None:
            k = torch.cat([cached[0].to(k.dtype), k], dim=2)
            v = torch.cat([cached[1].to(v.dtype), v], dim=2)
        if self.n_kv_heads != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        # Bidirectional: no causal mask; padding keys (left-padded batches) are masked out.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.o(y.transpose(1, 2).reshape(B, S, self.n_heads * self.head_dim)), own


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: Tensor, spec: StatsSpec | None = None) -> tuple[Tensor, Tensor | None]:
        a = F.silu(self.gate(x))
        h = a * self.up(x)
        stats = mlp_statistics(h, a, spec) if spec is not None else None
        return self.down(h), stats


def mlp_statistics(h: Tensor, a: Tensor, spec: StatsSpec) -> Tensor:
    """Per-position sparsity statistics [B, len(STAT_NAMES), S] of the MLP hidden h and activated gate a."""
    abs_h, abs_a = h.float().abs(), a.float().abs()
    row_max = abs_h.amax(dim=-1, keepdim=True)
    frac_h = (abs_h < spec.abs_threshold).float().mean(-1)
    frac_a = (abs_a < spec.abs_threshold).float().mean(-1)
    frac_rel = (abs_h < spec.rel_threshold * row_max).float().mean(-1)
    return torch.stack([frac_h, frac_a, frac_rel, abs_h.mean(-1)], dim=1)


class TransformerLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        key_mask: Tensor | None,
        spec: StatsSpec | None = None,
        cached: KVPair | None = None,
    ) -> tuple[Tensor, Tensor | None, KVPair]:
        attn_out, kv = self.attn(self.attn_norm(x), cos, sin, key_mask, cached)
        x = x + attn_out
        mlp_out, stats = self.mlp(self.mlp_norm(x), spec)
        return x + mlp_out, stats, kv


class MaskPredictor(nn.Module):
    """Predicts every position's token from a partly masked sequence, attending in both directions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.n_embed_rows, cfg.d_model)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.n_embed_rows, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *,
        inputs_embeds: Tensor | None = None,
        stats: StatsSpec | None = None,
        return_kv: bool = False,
    ) -> ModelOutput:
        """input_ids [B, S] (or inputs_embeds [B, S, D]); attention_mask [B, S] is 1 for real tokens, 0 for padding.
        return_kv: also return every layer's keys and values (what `forward_window` takes as its cache)."""
        x = self.embed_inputs(input_ids) if inputs_embeds is None else inputs_embeds
        B, S, _ = x.shape
        if attention_mask is None:
            positions = torch.arange(S, device=x.device).expand(B, S)
            key_mask = None
        else:
            # Left padding: real tokens get positions 0..n-1, exactly as in a solo run.
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            key_mask = attention_mask.bool()[:, None, None, :]
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        wanted = set(stats.layers) if stats is not None else set()
        collected: list[Tensor] = []
        keys_values: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            x, layer_stats, kv = layer(x, cos, sin, key_mask, stats if i in wanted else None)
            if layer_stats is not None:
                collected.append(layer_stats)
            if return_kv:
                keys_values.append(torch.stack(kv).float())
        logits = self.lm_head(self.final_norm(x))
        cache = torch.stack(keys_values) if return_kv else None
        if stats is None:
            return ModelOutput(logits, None, cache)
        by_layer = dict(zip(sorted(wanted), collected, strict=True))
        return ModelOutput(logits, torch.stack([by_layer[i] for i in stats.layers], dim=1), cache)

    def forward_window(self, window_ids: Tensor, attention_mask: Tensor, window_start: Tensor, kv: Tensor) -> Tensor:
        """Logits [B, W, V] of the window columns [window_start[b], window_start[b] + W) of a sequence whose keys and
        values `kv` [n_layers, 2, B, n_kv_heads, S, head_dim] a full pass computed (attention_mask [B, S] is the whole
        sequence's). The window's keys and values are computed fresh; the cached ones of the window are not used."""
        x = self.embed_inputs(window_ids)
        W, S = x.shape[1], attention_mask.shape[1]
        columns = window_start[:, None] + torch.arange(W, device=x.device)[None, :]
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0).gather(1, columns)
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        seq = torch.arange(S, device=x.device)[None, :]
        in_window = (seq >= window_start[:, None]) & (seq < window_start[:, None] + W)
        real = attention_mask.bool()
        key_mask = torch.cat([real & ~in_window, real.gather(1, columns)], dim=1)[:, None, None, :]
        for i, layer in enumerate(self.layers):
            x, _, _ = layer(x, cos, sin, key_mask, cached=(kv[i, 0], kv[i, 1]))
        return self.lm_head(self.final_norm(x))

    def embed_inputs(self, input_ids: Tensor | None) -> Tensor:
        """Token embeddings [B, S, D]; a model whose prompts carry other inputs (pictures) embeds those here."""
        if input_ids is None:
            raise ConfigError("give input_ids or inputs_embeds")
        return self.embed(input_ids)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
