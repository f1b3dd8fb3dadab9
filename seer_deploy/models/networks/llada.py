"""The LLaDA-family mask predictor: a bidirectional Llama-style transformer in one readable file.

RMSNorm, rotary embeddings (rotate-half), grouped-query attention without a causal mask, SwiGLU MLP
`down(silu(gate(x)) * up(x))`, no biases. `forward` can also return Seer's per-position MLP activation
statistics, computed inside forward (torch.export rejects hooks), so the exported step-zero graph carries them.

The other families are options of the same network (ModelConfig, models.families.families), each a small branch here:
`qkv_bias` (Dream), `qk_norm` and `rotary_dim` (LLaDA-MoE), an MoE MLP (`num_experts`: models.networks.moe), `prefix_dlm`
(LaViDa: prompt positions do not attend to response positions; forward then needs `prompt_width`), and
`shift_logits` (Dream: token i is read from position i - 1). The shift is applied to the logits and to the
statistics alike, so statistic i belongs to the token it predicts and Seer's boundary indexes tokens as before.

KV caches: `forward(..., return_kv=True)` also returns every layer's keys and values (after rotary, before the
grouped-query repeat); `cached_hidden` runs only some columns of the sequence, their queries attending to their fresh
keys and values and to the cached ones of every other real position: a window of the block-wise cache (Fast-dLLM's
dual cache, `forward_window`) or the last prompt token and the response against the prompt cache.
"""

from __future__ import annotations

from typing import NamedTuple, TypedDict, Unpack

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.mlp_stats import mlp_statistics, statistics_when
from seer_deploy.models.networks.moe import MoEMLP


class ModelOutput(NamedTuple):
    logits: Tensor  # [B, S, V]
    stats: Tensor | None  # [B, len(spec.layers), len(STAT_NAMES), S] in float32, or None
    kv: Tensor | None = None  # [n_layers, 2, B, n_kv_heads, S, head_dim] in float32 (return_kv), or None



class HiddenOutput(NamedTuple):
    hidden: Tensor  # [B, S, D]: the last layer's output, before the final norm and the LM head (`logits_of`)
    stats: Tensor | None  # as ModelOutput.stats
    kv: Tensor | None = None  # as ModelOutput.kv


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


def rope_tables(positions: Tensor, head_dim: int, theta: float, section: tuple[int, ...] | None = None
                ) -> tuple[Tensor, Tensor]:
    """cos/sin tables [B, 1, S, head_dim] for integer positions [B, S], in float32 (LLaDA's full-precision rope);
    head_dim here is the rotated dims (ModelConfig.rotary). M-RoPE (Dimple, Qwen2-VL): positions [3, B, S] and
    `section` (ModelConfig.mrope_section): the first section[0] frequencies turn with the temporal position, the next
    section[1] with the height, the rest with the width."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    if section is None:
        angles = positions.float()[..., None] * inv_freq  # [B, S, head_dim/2]
    else:
        bounds = [sum(section[:axis]) for axis in range(len(section) + 1)]
        angles = torch.cat([positions[axis].float()[..., None] * inv_freq[bounds[axis]:bounds[axis + 1]]
                            for axis in range(len(section))], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first cos.shape[-1] dims of each head (all of them unless the rotary embedding is partial)."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        if cfg.qk_norm:  # per head, before the rotary embedding (LLaDA-MoE)
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor | None, cached: KVPair | None = None
    ) -> tuple[Tensor, KVPair]:
        """The attention output and this call's own keys and values; `cached` keys and values are attended to
        before them (key_mask then covers cached + own positions)."""
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        own = (k, v)
        if cached is not None:
            k = torch.cat([cached[0].to(k.dtype), k], dim=2)
            v = torch.cat([cached[1].to(v.dtype), v], dim=2)
        if self.n_kv_heads != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        # Bidirectional: no causal mask; padding keys (left-padded batches) are masked out, and with prefix-DLM the
        # response keys for prompt queries (key_mask [B, 1, S or 1, S_keys]).
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.o(y.transpose(1, 2).reshape(B, S, self.n_heads * self.head_dim)), own


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: Tensor, spec: StatsSpec | None = None, wanted: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        a = F.silu(self.gate(x))
        h = a * self.up(x)
        if spec is None:
            return self.down(h), None

        def compute(h: Tensor, a: Tensor) -> Tensor:
            return mlp_statistics(h, a, spec)

        return self.down(h), statistics_when(wanted, compute, h, a)


class TransformerLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mlp: MLP | MoEMLP = MoEMLP(cfg) if cfg.num_experts else MLP(cfg)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        key_mask: Tensor | None,
        spec: StatsSpec | None = None,
        cached: KVPair | None = None,
        stats_wanted: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, KVPair]:
        attn_out, kv = self.attn(self.attn_norm(x), cos, sin, key_mask, cached)
        x = x + attn_out
        mlp_out, stats = self.mlp(self.mlp_norm(x), spec, stats_wanted)
        return x + mlp_out, stats, kv


class PassOptions(TypedDict, total=False):
    """What a pass takes beside its ids and mask (`MaskPredictor.forward` and `.hidden_states` alike)."""

    inputs_embeds: Tensor | None  # [B, S, D], instead of input_ids
    stats: StatsSpec | None  # the Seer statistics to return
    return_kv: bool  # also return every layer's keys and values (what `forward_window` takes as its cache)
    prompt_width: Tensor | None  # [B] int64, prefix-DLM models only: columns [0, prompt_width) hold the prompt
    position_ids: Tensor | None  # [3, B, S] int64, M-RoPE models only (models.pictures.mrope); None: 1-D positions


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

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                **options: Unpack[PassOptions]) -> ModelOutput:
        """input_ids [B, S] (or options' inputs_embeds [B, S, D]); attention_mask [B, S] is 1 for real tokens, 0 for
        padding."""
        out = self.hidden_states(input_ids, attention_mask, **options)
        return ModelOutput(self.shifted(self.logits_of(out.hidden), dim=1), out.stats, out.kv)

    def hidden_states(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None, *,
                      stats_wanted: Tensor | None = None, **options: Unpack[PassOptions]) -> HiddenOutput:
        """`forward` without the LM head: the last layer's hidden states [B, S, D] (unshifted; `logits_of` turns any
        rows of them into logits), the statistics (shifted like the logits) and the cache.
        stats_wanted (a 0-d bool tensor): compute the statistics only where it is true (zeros otherwise)."""
        inputs_embeds, stats, return_kv = options.get("inputs_embeds"), options.get("stats"), options.get("return_kv")
        prompt_width, position_ids = options.get("prompt_width"), options.get("position_ids")
        x = self.embed_inputs(input_ids) if inputs_embeds is None else inputs_embeds
        B, S, _ = x.shape
        if attention_mask is None:
            positions = torch.arange(S, device=x.device).expand(B, S)
            key_mask = None
        else:
            # Left padding: real tokens get positions 0..n-1, exactly as in a solo run.
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            key_mask = attention_mask.bool()[:, None, None, :]
        if self.cfg.prefix_dlm:
            key_mask = self.prefix_mask(key_mask, prompt_width, B, S, x.device)
        if position_ids is not None:
            if self.cfg.mrope_section is None:
                raise ConfigError("position_ids [3, B, S] are M-RoPE positions; this model has no mrope_section")
            cos, sin = rope_tables(position_ids, self.cfg.rotary, self.cfg.rope_theta, self.cfg.mrope_section)
        else:  # 1-D positions: also what M-RoPE gives a prompt without pictures
            cos, sin = rope_tables(positions, self.cfg.rotary, self.cfg.rope_theta)
        wanted = set(stats.layers) if stats is not None else set()
        collected: list[Tensor] = []
        keys_values: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            x, layer_stats, kv = layer(x, cos, sin, key_mask, stats if i in wanted else None,
                                       stats_wanted=stats_wanted)
            if layer_stats is not None:
                collected.append(layer_stats)
            if return_kv:
                keys_values.append(torch.stack(kv).float())
        cache = torch.stack(keys_values) if return_kv else None
        if stats is None:
            return HiddenOutput(x, None, cache)
        by_layer = dict(zip(sorted(wanted), collected, strict=True))
        return HiddenOutput(x, self.shifted(torch.stack([by_layer[i] for i in stats.layers], dim=1), dim=-1), cache)

    def logits_of(self, hidden: Tensor) -> Tensor:
        """The LM head on hidden states of any shape [..., D] (the final norm is per position)."""
        return self.lm_head(self.final_norm(hidden))

    def logit_source(self, columns: Tensor) -> Tensor:
        """The column whose hidden state gives each column's logits: itself, or with shift_logits (Dream) the one
        before it (column 0 keeps its own), as `shifted` does."""
        return (columns - 1).clamp(min=0) if self.cfg.shift_logits else columns

    def shifted(self, values: Tensor, dim: int) -> Tensor:
        """With shift_logits (Dream), position i's values are those computed at position i - 1 (position 0 keeps its
        own): the logits and the statistics of the token at i both come from the hidden state that predicts it."""
        if not self.cfg.shift_logits:
            return values
        n = values.shape[dim]
        return torch.cat([values.narrow(dim, 0, 1), values.narrow(dim, 0, n - 1)], dim=dim)

    @staticmethod
    def prefix_mask(key_mask: Tensor | None, prompt_width: Tensor | None, B: int, S: int,
                    device: torch.device) -> Tensor:
        """Prefix-DLM attention [B, 1, S, S]: prompt queries see no response keys; response queries see every key."""
        if prompt_width is None:
            raise ConfigError("this model uses prefix-DLM attention (LaViDa): pass prompt_width, the column where the "
                              "response starts")
        col = torch.arange(S, device=device)[None, :]
        is_prompt = col < prompt_width.to(device)[:, None]  # [B, S]
        allowed = ~(is_prompt[:, :, None] & ~is_prompt[:, None, :])  # [B, query, key]
        return allowed[:, None] if key_mask is None else allowed[:, None] & key_mask

    def forward_window(self, window_ids: Tensor, attention_mask: Tensor, window_start: Tensor, kv: Tensor,
                       prompt_width: Tensor | None = None, position_shift: Tensor | None = None) -> Tensor:
        """Logits [B, W, V] of the window columns (`cached_hidden` and the LM head); with shift_logits the shift runs
        inside the window, so its first column's logits are its own (the loop starts a window one column before the
        block it commits in: `window_lead`)."""
        return self.shifted(self.logits_of(self.cached_hidden(window_ids, attention_mask, window_start, kv,
                                                              prompt_width, position_shift)), dim=1)

    @property
    def window_lead(self) -> int:
        """Columns a cached pass runs before the first one it commits in: 1 where a token is read from the column
        before it (shift_logits), else 0."""
        return int(self.cfg.shift_logits)

    def cached_hidden(self, run_ids: Tensor, attention_mask: Tensor, run_start: Tensor, kv: Tensor,
                      prompt_width: Tensor | None = None, position_shift: Tensor | None = None) -> Tensor:
        """Hidden states [B, W, D] of the columns [run_start[b], run_start[b] + W) of a sequence (attention_mask
        [B, S] is the whole sequence's), their keys and values computed fresh, against cached ones `kv`
        [n_layers, 2, B, n_kv_heads, C, head_dim] of its first C columns (C <= S) that a full pass returned; cached
        columns inside the run are not used. The block-wise cache passes every column (C = S) and a window; the
        prompt cache the columns before the run (C = run_start). With prefix-DLM (prompt_width [B]) a query in the
        prompt sees no response key. An M-RoPE model's run columns are text after the row's pictures: their three
        positions are the 1-D one plus `position_shift` [B] (models.pictures.mrope.text_position_shift)."""
        x = self.embed_inputs(run_ids)
        B, W, C = x.shape[0], x.shape[1], kv.shape[4]
        columns = run_start[:, None] + torch.arange(W, device=x.device)[None, :]
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0).gather(1, columns)
        if position_shift is not None:
            positions = positions + position_shift.to(positions)[:, None]
        cos, sin = rope_tables(positions, self.cfg.rotary, self.cfg.rope_theta)
        cached = torch.arange(C, device=x.device)[None, :].expand(B, C)
        in_run = (cached >= run_start[:, None]) & (cached < run_start[:, None] + W)
        real = attention_mask.bool()
        key_mask = torch.cat([real[:, :C] & ~in_run, real.gather(1, columns)], dim=1)[:, None, None, :]
        if self.cfg.prefix_dlm:
            if prompt_width is None:
                raise ConfigError("this model uses prefix-DLM attention (LaViDa): pass prompt_width, the column where "
                                  "the response starts")
            width = prompt_width.to(x.device)[:, None]
            prompt_query = columns < width  # [B, W]
            response_key = torch.cat([cached, columns], dim=1) >= width  # [B, C + W]
            key_mask = key_mask & ~(prompt_query[:, None, :, None] & response_key[:, None, None, :])
        for i, layer in enumerate(self.layers):
            x, _, _ = layer(x, cos, sin, key_mask, cached=(kv[i, 0], kv[i, 1]))
        return x

    def embed_inputs(self, input_ids: Tensor | None) -> Tensor:
        """Token embeddings [B, S, D]; a model whose prompts carry other inputs (pictures) embeds those here."""
        if input_ids is None:
            raise ConfigError("give input_ids or inputs_embeds")
        return self.embed(input_ids)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
