"""Dimple's vision front end: Qwen2.5-VL's vision transformer (`visual.*`) and Dimple's projector (`img_projector.*`).

Patches -> Conv3d patch embedding (a matrix product: kernel = stride = one patch) -> `depth` blocks (RMSNorm,
attention with 2-D rotary positions, RMSNorm, SwiGLU MLP with biases), windowed attention except in
`fullatt_block_indexes` -> the patch merger (RMSNorm, 2 x 2 patches concatenated, Linear, GELU, Linear) -> Dimple's
projector (Linear, the language model's activation, Linear) -> one embedding per image token in the LM's width.

Everything the tower derives from the pictures' grids with Python loops (window order, boundaries, rotary tables)
comes in as inputs (models.pictures.qwen_layout.tower_inputs), so the module traces into one graph for every picture
size; the attention masks are built in-graph from the boundaries' segment ids. Parameter names are transformers'
Qwen2_5_VisionTransformerPretrainedModel's, so a checkpoint's `visual.*` tensors load by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seer_deploy.core.checks import int_in
from seer_deploy.core.errors import CheckpointError
from seer_deploy.models.networks.llada import RMSNorm
from seer_deploy.models.pictures.qwen_layout import TowerGeometry

# The model_type values a Qwen2.5-VL-style tower config carries (Dimple's DimpleVisionConfig says "dimple").
TOWER_TYPES: tuple[str, ...] = ("dimple", "qwen2_5_vl", "qwen2_5_vl_vision")
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"silu": F.silu, "gelu": F.gelu}  # the projector's (the LM's hidden_act) and the tower MLP's
VISION_EPS = 1e-6  # the tower's RMSNorm epsilon (fixed in Qwen2.5-VL's code, not in its config)


@dataclass(frozen=True)
class QwenTowerConfig:
    """A Qwen2.5-VL vision tower (defaults: Qwen2.5-VL-7B's, as Dimple's DimpleVisionConfig has them)."""

    depth: int = 32
    hidden_size: int = 1280
    intermediate_size: int = 3420
    num_heads: int = 16
    out_hidden_size: int = 3584
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    in_channels: int = 3
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "patch_size",
                     "temporal_patch_size", "spatial_merge_size", "window_size"):
            if not int_in(getattr(self, name), 1, 1 << 16):
                raise CheckpointError(f"vision_config '{name}' is {getattr(self, name)!r}; it must be an integer from "
                                      "1 to 65536; fix the vision tower config")
        unsupported = [
            (self.in_channels != 3, f"in_channels {self.in_channels} (pictures are RGB: 3)"),
            (self.hidden_act not in ACTIVATIONS, f"hidden_act {self.hidden_act!r} (silu or gelu)"),
            (self.hidden_size % self.num_heads != 0 or (self.hidden_size // self.num_heads) % 4 != 0,
             (f"hidden_size {self.hidden_size} / num_heads {self.num_heads} (the head size must be a multiple of "
              "4 for the 2-D rotary embedding)")),
            (self.window_size % (self.patch_size * self.spatial_merge_size) != 0,
             f"window_size {self.window_size} (a multiple of patch_size x spatial_merge_size)"),
            (any(not int_in(i, 0, self.depth - 1) for i in self.fullatt_block_indexes),
             f"fullatt_block_indexes {list(self.fullatt_block_indexes)} (block indexes below depth {self.depth})"),
        ]
        for refused, what in unsupported:
            if refused:
                raise CheckpointError(f"the Qwen2.5-VL vision tower with {what} is not implemented; fix "
                                      "vision_config in config.json")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> QwenTowerConfig:
        """From config.json's `vision_config` (unknown keys such as tokens_per_second are ignored)."""
        kind = raw.get("model_type")
        if kind is not None and kind not in TOWER_TYPES:
            raise CheckpointError(f"vision_config model_type {kind!r} is not implemented: Dimple's tower is "
                                  f"Qwen2.5-VL's ({', '.join(TOWER_TYPES)}); fix vision_config in config.json")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known and v is not None}
        if "fullatt_block_indexes" in values:
            blocks = values["fullatt_block_indexes"]
            if not isinstance(blocks, list | tuple) or not all(int_in(b, 0, 1 << 16) for b in blocks):
                raise CheckpointError(f"vision_config 'fullatt_block_indexes' is {blocks!r}; it must be a list of "
                                      "block indexes")
            values["fullatt_block_indexes"] = tuple(blocks)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Numbers per patch: channels x frames x rows x columns (3 x 2 x 14 x 14 = 1176)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def geometry(self) -> TowerGeometry:
        return TowerGeometry(self.patch_size, self.spatial_merge_size, self.window_size, self.head_dim)


class PatchEmbed(nn.Module):
    """The Conv3d patch embedding; its kernel is its stride, so it is one matrix product per patch."""

    def __init__(self, cfg: QwenTowerConfig) -> None:
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel, stride=kernel, bias=False)

    def forward(self, patches: Tensor) -> Tensor:
        return F.linear(patches.to(self.proj.weight.dtype), self.proj.weight.flatten(1))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half rotary embedding, in float32."""
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat([-second, first], dim=-1) * sin).to(x.dtype)


class VisionAttention(nn.Module):
    def __init__(self, cfg: QwenTowerConfig) -> None:
        super().__init__()
        self.heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, allowed: Tensor) -> Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(1, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)  # [1, heads, n, d]
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, attn_mask=allowed)
        return self.proj(y[0].transpose(0, 1).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: QwenTowerConfig) -> None:
        super().__init__()
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, cfg: QwenTowerConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, VISION_EPS)
        self.attn = VisionAttention(cfg)
        self.norm2 = RMSNorm(cfg.hidden_size, VISION_EPS)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, allowed: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, allowed)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """RMSNorm, then each merged token's patches side by side, Linear, GELU, Linear into out_hidden_size."""

    def __init__(self, cfg: QwenTowerConfig) -> None:
        super().__init__()
        width = cfg.hidden_size * cfg.spatial_merge_size**2
        self.ln_q = RMSNorm(cfg.hidden_size, VISION_EPS)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, cfg.out_hidden_size))

    def forward(self, x: Tensor, tokens: int) -> Tensor:
        return self.mlp(self.ln_q(x).reshape(tokens, -1))


def same_segment(segments: Tensor, unit: int) -> Tensor:
    """bool [patches, patches]: patch i may attend to patch j when their merged tokens share a segment."""
    n = segments.shape[0]
    same = segments[:, None] == segments[None, :]
    return same[:, None, :, None].expand(n, unit, n, unit).reshape(n * unit, n * unit)


class QwenVisionTower(nn.Module):
    """Qwen2.5-VL's vision transformer on host-prepared inputs (qwen_layout.tower_inputs) -> [image_tokens,
    out_hidden_size], image tokens picture by picture (transformers' `pooler_output`)."""

    def __init__(self, cfg: QwenTowerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)

    def forward(self, pixel_patches: Tensor, rotary_cos: Tensor, rotary_sin: Tensor, window_segments: Tensor,
                picture_segments: Tensor, restore_order: Tensor) -> Tensor:
        tokens, unit, _ = pixel_patches.shape
        x = self.patch_embed(pixel_patches.flatten(0, 1))
        in_window, in_picture = same_segment(window_segments, unit), same_segment(picture_segments, unit)
        cos, sin = rotary_cos.flatten(0, 1).float()[None, None], rotary_sin.flatten(0, 1).float()[None, None]
        full = set(self.cfg.fullatt_block_indexes)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, in_picture if i in full else in_window)
        return self.merger(x, tokens)[restore_order]


class Projector(nn.Module):
    """Dimple's img_projector: linear_1 (tower width -> LM width), the LM's activation, linear_2."""

    def __init__(self, tower_width: int, lm_width: int, activation: str) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise CheckpointError(f"config.json hidden_act {activation!r} is not implemented for Dimple's projector "
                                  f"(one of {', '.join(ACTIVATIONS)})")
        self.act = ACTIVATIONS[activation]
        self.linear_1 = nn.Linear(tower_width, lm_width)
        self.linear_2 = nn.Linear(lm_width, lm_width)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class DimpleVisionEncoder(nn.Module):
    """Tower then projector; attribute names are the checkpoint's prefixes (`visual.`, `img_projector.`)."""

    def __init__(self, cfg: QwenTowerConfig, lm_width: int, activation: str = "silu") -> None:
        super().__init__()
        self.cfg = cfg
        self.visual = QwenVisionTower(cfg)
        self.img_projector = Projector(cfg.out_hidden_size, lm_width, activation)

    def forward(self, pixel_patches: Tensor, rotary_cos: Tensor, rotary_sin: Tensor, window_segments: Tensor,
                picture_segments: Tensor, restore_order: Tensor) -> Tensor:
        dtype = self.img_projector.linear_1.weight.dtype
        features = self.visual(pixel_patches.to(dtype), rotary_cos, rotary_sin, window_segments, picture_segments,
                               restore_order)
        return self.img_projector(features)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
