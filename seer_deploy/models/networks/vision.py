"""The LLaDA-V / LLaVA vision front end: a SigLIP vision tower, a feature layer, an MLP projector into the LM width.

Pixels [N, 3, H, W] -> SigLIP patch embeddings -> the first k encoder layers (the hidden state LLaVA selects with
`mm_vision_select_layer`: -2 = the output of the second-to-last layer, before the post-layernorm) -> the projector
(`mlp2x_gelu`: Linear, GELU, Linear) -> one embedding per patch in the language model's width -> optionally LaViDa's
2-D pooling of the patch grid (`pool_stride` > 1: 27 x 27 -> 14 x 14 bilinear) -> plus LLaVA's `image_newline`
vector when the patch-merge type asks for it. Only the layers that feed the selected one are built, so a checkpoint
that stores the unused last layer (or, like LLaVA-OneVision's and LaViDa's, drops it) loads either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seer_deploy.core.checks import int_in, number_in
from seer_deploy.core.errors import CheckpointError
from seer_deploy.models.pictures.anyres import AnyresConfig
from seer_deploy.models.pictures.image import MAX_IMAGE_SIZE, ImageConfig

# SiglipVisionConfig fields read from a checkpoint's vision config (others, e.g. model_type, are ignored).
SIGLIP_FIELDS: tuple[str, ...] = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_channels",
    "image_size",
    "patch_size",
    "hidden_act",
    "layer_norm_eps",
)
SIGLIP_REQUIRED: tuple[str, ...] = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "image_size", "patch_size"
)
# Inclusive ranges of the integer fields (where present): generous for real towers (so400m: 1152 wide, 27 layers).
SIGLIP_RANGES: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 1 << 15),
    "intermediate_size": (1, 1 << 17),
    "num_hidden_layers": (1, 256),
    "num_attention_heads": (1, 1 << 10),
    "num_channels": (3, 3),  # images are converted to RGB
    "image_size": (1, MAX_IMAGE_SIZE),
    "patch_size": (1, MAX_IMAGE_SIZE),
}
SELECT_FEATURES: tuple[str, ...] = ("patch", "cls_patch")  # SigLIP has no CLS token: both mean every patch
# LaViDa's get_2dPool modes (after the projector): bilinear resizes the grid to ceil(side / stride), the others pool
# with kernel = stride (floor(side / stride)).
POOL_MODES: tuple[str, ...] = ("bilinear", "average", "max")
_MLP_GELU = re.compile(r"^mlp(\d{1,4})x_gelu$")
MAX_PROJECTOR_DEPTH = 16  # LLaVA uses 2


def projector_depth(projector_type: str) -> int:
    """Number of Linear layers of a LLaVA projector type: 'linear' -> 1, 'mlpNx_gelu' -> N."""
    if projector_type == "linear":
        return 1
    match = _MLP_GELU.match(projector_type) if isinstance(projector_type, str) else None
    if match and 1 <= int(match.group(1)) <= MAX_PROJECTOR_DEPTH:
        return int(match.group(1))
    raise CheckpointError(
        f"mm_projector_type '{projector_type}' is not supported; seer-deploy builds 'linear' and 'mlpNx_gelu' "
        f"(e.g. 'mlp2x_gelu', N up to {MAX_PROJECTOR_DEPTH}) projectors"
    )


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower, feature selection, projector and image preprocessing of a multimodal checkpoint."""

    siglip: dict[str, Any]  # SiglipVisionConfig fields (SIGLIP_FIELDS)
    lm_hidden_size: int  # the language model's width (projector output)
    mm_hidden_size: int  # the tower's width (projector input)
    image: ImageConfig
    select_layer: int = -2
    select_feature: str = "patch"
    projector_type: str = "mlp2x_gelu"
    patch_merge_type: str = "flat"  # 'unpad' in it: one learned image_newline vector after each image's patches
    image_token_index: int = -200  # the prompt placeholder (LLaVA's IMAGE_TOKEN_INDEX)
    pool_stride: int = 1  # LaViDa: 2 pools the projected patch grid 2x2 (1 = no pooling, LLaDA-V)
    pool_mode: str = "bilinear"  # LaViDa's mm_spatial_pool_mode (POOL_MODES)
    # LaViDa's anyres tiling: a picture becomes a base view and a grid of crops, its token count depends on its size
    # (`tokens_per_image` is then one view's); None: one view per picture
    anyres: AnyresConfig | None = None

    def __post_init__(self) -> None:
        missing = [k for k in SIGLIP_REQUIRED if k not in self.siglip]
        if missing:
            raise CheckpointError(f"the vision tower config lacks {', '.join(missing)}; add them to its vision_config")
        for key, (lo, hi) in SIGLIP_RANGES.items():
            if key in self.siglip and not int_in(self.siglip[key], lo, hi):
                raise CheckpointError(
                    f"vision_config '{key}' is {self.siglip[key]!r}; it must be an integer from {lo} to {hi}; fix the "
                    "vision tower config"
                )
        if "layer_norm_eps" in self.siglip and not number_in(self.siglip["layer_norm_eps"], 0.0, 1.0, above_lo=True):
            raise CheckpointError(
                f"vision_config 'layer_norm_eps' is {self.siglip['layer_norm_eps']!r}; it must be a finite number "
                "above 0 and at most 1; fix the vision tower config"
            )
        if self.siglip["hidden_size"] % self.siglip["num_attention_heads"]:
            raise CheckpointError(
                f"vision_config num_attention_heads {self.siglip['num_attention_heads']} does not divide hidden_size "
                f"{self.siglip['hidden_size']}; fix the vision tower config"
            )
        for name, value, lo, hi in (
            ("lm_hidden_size", self.lm_hidden_size, 1, 1 << 16),
            ("mm_hidden_size", self.mm_hidden_size, 1, 1 << 15),
            ("mm_vision_select_layer", self.select_layer, -(1 << 10), 1 << 10),
            ("image_token_index", self.image_token_index, -(1 << 31), -1),
        ):
            if not int_in(value, lo, hi):
                raise CheckpointError(f"config.json '{name}' is {value!r}; it must be an integer from {lo} to {hi}"
                                      + (" (negative, so it never collides with a token id)" if hi == -1 else ""))
        if self.mm_hidden_size != self.siglip["hidden_size"]:
            raise CheckpointError(
                f"mm_hidden_size {self.mm_hidden_size} differs from the vision tower's hidden_size "
                f"{self.siglip['hidden_size']}; the config and the vision tower disagree"
            )
        if self.select_feature not in SELECT_FEATURES:
            raise CheckpointError(
                f"mm_vision_select_feature {self.select_feature!r} is not supported for a SigLIP tower; use 'patch'"
            )
        if self.siglip["patch_size"] > self.siglip["image_size"]:
            raise CheckpointError(
                f"patch_size {self.siglip['patch_size']} exceeds image_size {self.siglip['image_size']}; "
                "fix vision_config"
            )
        projector_depth(self.projector_type)
        self.layers_to_run  # noqa: B018 - validates select_layer
        if not int_in(self.pool_stride, 1, self.grid_side):
            raise CheckpointError(
                f"mm_spatial_pool_stride {self.pool_stride!r} must be an integer from 1 (no pooling) to the patch grid's "
                f"side {self.grid_side}; LaViDa uses 2"
            )
        if self.pool_mode not in POOL_MODES:
            raise CheckpointError(
                f"mm_spatial_pool_mode {self.pool_mode!r} is not supported; use one of {', '.join(POOL_MODES)} "
                "(LaViDa uses bilinear)"
            )

    @property
    def layers_to_run(self) -> int:
        """Encoder layers feeding hidden_states[select_layer] (hidden_states[0] is the patch embedding)."""
        n = int(self.siglip["num_hidden_layers"])
        k = self.select_layer if self.select_layer >= 0 else n + 1 + self.select_layer
        if not 0 <= k <= n:
            raise CheckpointError(
                f"mm_vision_select_layer {self.select_layer} is outside the tower's {n} layers "
                f"(valid: {-(n + 1)}..{n}); LLaDA-V uses -2"
            )
        return k

    @property
    def grid_side(self) -> int:
        """SigLIP's patch convolution has no padding: 384 px at patch 14 gives a 27 x 27 patch grid."""
        return int(self.siglip["image_size"]) // int(self.siglip["patch_size"])

    @property
    def patches_per_image(self) -> int:
        return self.grid_side**2

    @property
    def pooled_side(self) -> int:
        """The grid's side after pooling: bilinear rounds up (27 -> 14), average and max pooling round down (13)."""
        if self.pool_stride == 1:
            return self.grid_side
        if self.pool_mode == "bilinear":
            return -(-self.grid_side // self.pool_stride)
        return self.grid_side // self.pool_stride

    @property
    def newline(self) -> bool:
        return "unpad" in self.patch_merge_type

    @property
    def tokens_per_image(self) -> int:
        """Embeddings one image contributes to the prompt."""
        return self.pooled_side**2 + (1 if self.newline else 0)

    def siglip_config(self) -> Any:
        """transformers' SiglipVisionConfig for the layers that run (no pooling head: LLaVA drops it)."""
        from transformers import SiglipVisionConfig

        fields = {k: self.siglip[k] for k in SIGLIP_FIELDS if k in self.siglip}
        fields.update(num_hidden_layers=self.layers_to_run, vision_use_head=False, attn_implementation="sdpa")
        return SiglipVisionConfig(**fields)

    def to_dict(self) -> dict[str, Any]:
        return {
            "siglip": dict(self.siglip),
            "lm_hidden_size": self.lm_hidden_size,
            "mm_hidden_size": self.mm_hidden_size,
            "image": {
                "image_size": self.image.image_size,
                "mean": list(self.image.mean),
                "std": list(self.image.std),
                "aspect": self.image.aspect,
            },
            "select_layer": self.select_layer,
            "select_feature": self.select_feature,
            "projector_type": self.projector_type,
            "patch_merge_type": self.patch_merge_type,
            "image_token_index": self.image_token_index,
            "pool_stride": self.pool_stride,
            "pool_mode": self.pool_mode,
            "tokens_per_image": self.tokens_per_image,
            "anyres": None if self.anyres is None else self.anyres.to_dict(),
        }


class VisionTower(nn.Module):
    """SigLIP patch embedding and the encoder layers up to the selected one: pixels -> [N, patches, mm_hidden]."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        from transformers import SiglipVisionModel

        model = SiglipVisionModel(cfg.siglip_config())
        # transformers 4.x wraps the transformer in `.vision_model`; 5.x does not. `body` is the transformer either
        # way, so its parameter names are the checkpoint's names after the `...vision_model.` prefix.
        self.body = getattr(model, "vision_model", model)

    def forward(self, pixel_values: Tensor) -> Tensor:
        hidden = self.body.embeddings(pixel_values)
        for layer in self.body.encoder.layers:
            out = layer(hidden, None)
            hidden = out[0] if isinstance(out, tuple) else out  # transformers 4.x layers return tuples
        return hidden


def build_projector(cfg: VisionConfig) -> nn.Sequential:
    """LLaVA's projector: Linear(mm_hidden, D) then (GELU, Linear(D, D)) x (depth - 1); state names 0, 2, 4, ..."""
    depth = projector_depth(cfg.projector_type)
    modules: list[nn.Module] = [nn.Linear(cfg.mm_hidden_size, cfg.lm_hidden_size)]
    for _ in range(1, depth):
        modules += [nn.GELU(), nn.Linear(cfg.lm_hidden_size, cfg.lm_hidden_size)]
    return nn.Sequential(*modules)


def pool_grid(feats: Tensor, cfg: VisionConfig) -> Tensor:
    """LaViDa's 2-D pooling of projected patch features [N, side * side, D] -> [N, pooled_side ** 2, D] (row-major,
    as LaViDa's get_2dPool: bilinear without corner alignment, or average / max pooling with kernel = stride)."""
    if cfg.pool_stride == 1:
        return feats
    n, _, width = feats.shape
    side = cfg.grid_side
    grid = feats.reshape(n, side, side, width).permute(0, 3, 1, 2)
    if cfg.pool_mode == "bilinear":
        pooled = F.interpolate(grid, size=(cfg.pooled_side, cfg.pooled_side), mode="bilinear", align_corners=False)
    elif cfg.pool_mode == "average":
        pooled = F.avg_pool2d(grid, cfg.pool_stride)
    else:
        pooled = F.max_pool2d(grid, cfg.pool_stride)
    return pooled.permute(0, 2, 3, 1).reshape(n, cfg.pooled_side**2, width)


class VisionEncoder(nn.Module):
    """pixel_values [N, 3, H, W] -> image embeddings [N, tokens_per_image, lm_hidden_size]."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tower = VisionTower(cfg)
        self.projector = build_projector(cfg)
        self.image_newline = nn.Parameter(torch.zeros(cfg.lm_hidden_size)) if cfg.newline else None

    def forward(self, pixel_values: Tensor) -> Tensor:
        dtype = next(self.projector.parameters()).dtype
        feats = pool_grid(self.projector(self.tower(pixel_values.to(dtype))), self.cfg)
        if self.image_newline is not None:
            newline = self.image_newline.to(feats.dtype).expand(feats.shape[0], 1, feats.shape[-1])
            feats = torch.cat([feats, newline], dim=1)
        return feats

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
