"""LaViDa checkpoints (jacklishufan/LaViDa): which variant a config.json is, and the vision rules LaViDa adds to LLaVA's.

Two variants share LLaVA's vision side (`model.vision_tower.vision_tower.vision_model.*`, `model.mm_projector.{0,2}`
mlp2x_gelu, `model.image_newline`) and differ in the language model:
- LaViDa-LLaDA: `architectures` ["LlavaLladaForMaskedDiffusion"], `model_type` "llava_llada" (as LLaDA-V's):
  LLaDA's original names and fields (`model.transformer.blocks.N...`, `d_model`, `n_layers`, ...).
- LaViDa-Dream: `architectures` ["LlavaDreamForMaskedDiffusion"], `model_type` "llava_dream": Dream's Qwen2 names
  and fields (`model.layers.N...`, `hidden_size`, biases on q/k/v, shifted logits).

What LaViDa's public code does beyond LLaDA-V (and what is read from config.json here):
- The SigLIP tower is built with its last encoder layer deleted and its output taken as is: the second-to-last
  layer's hidden state, so `mm_vision_select_layer` is -2 whatever the config says (LaViDa's tower ignores it).
- The projected patch grid is pooled 2-D (`get_2dPool`, stride 2): 27 x 27 -> 14 x 14 = 196 tokens per view,
  `mm_spatial_pool_mode` "bilinear" (the training default; "average" and "max" also exist). The public code switches
  pooling with an environment variable (NOT_ALWASY_DO_2DPOOL, set for the low-resolution checkpoint), not with the
  config; here `mm_spatial_pool_stride` decides: null or absent -> 2 (the HD checkpoints), 1 -> no pooling.
- `image_aspect_ratio` "anyres" with LaViDa's own `image_grid_pinpoints` ([384, 768], [768, 384], [768, 768],
  [1152, 384], [384, 1152]): the tiling and the merge are models.pictures.anyres (`lavida_anyres` reads them into
  `VisionConfig.anyres`); the generation service encodes each picture's views and expands its placeholder to that
  picture's own token count (image_placeholders.encode_pictures); with "pad" each picture is one base view.
- Generation uses prefix-DLM attention (`prefix_lm=True` in LaViDa's predict.py and its COCO scripts): the prompt
  (pictures included) does not attend to the answer, so its keys and values can be computed once.
"""

from __future__ import annotations

from typing import Any

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.models.pictures.anyres import AnyresConfig, parse_pinpoints

LLADA, DREAM = "llada", "dream"
MODEL_TYPES: dict[str, str] = {"llava_llada": LLADA, "llava_dream": DREAM}  # what we write (llava_llada: also LLaDA-V)
ARCHITECTURES: dict[str, str] = {"LlavaLladaForMaskedDiffusion": LLADA, "LlavaDreamForMaskedDiffusion": DREAM}
VARIANT_NAMES: dict[str, str] = {LLADA: "LaViDa-LLaDA", DREAM: "LaViDa-Dream"}
DEFAULT_POOL_STRIDE = 2  # get_2dPool's default stride
DEFAULT_POOL_MODE = "bilinear"  # train.py's mm_spatial_pool_mode default
SELECT_LAYER = -2  # the tower runs without its last layer
GRID_PINPOINTS: list[list[int]] = [[384, 768], [768, 384], [768, 768], [1152, 384], [384, 1152]]


def lavida_variant(raw: dict[str, Any]) -> str | None:
    """'llada' or 'dream' for a LaViDa config.json, None for any other model.

    `architectures` names the class that saved it (LlavaLladaForMaskedDiffusion / LlavaDreamForMaskedDiffusion). The
    model_type alone is not enough: LLaDA-V's is "llava_llada" too, so "llava_llada" counts as LaViDa only with
    LLaDA's original fields (`d_model`; LLaDA-V's language model has Llama-style `hidden_size`)."""
    archs = raw.get("architectures")
    for arch in archs if isinstance(archs, list) else []:
        if isinstance(arch, str) and arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    model_type = raw.get("model_type")
    if model_type == "llava_dream":
        return DREAM
    if model_type == "llava_llada" and "d_model" in raw:
        return LLADA
    return None


def lavida_vision_fields(raw: dict[str, Any], variant: str) -> dict[str, Any]:
    """VisionConfig fields a LaViDa config.json implies (select layer, pooling), checked before anything loads."""
    name = VARIANT_NAMES[variant]
    merge = raw.get("mm_patch_merge_type") or "flat"
    if not isinstance(merge, str) or not (merge == "flat" or merge.startswith("spatial")):
        raise CheckpointError(
            f"{name}: mm_patch_merge_type {merge!r} is not one LaViDa runs; use 'spatial_unpad' (its checkpoints: the "
            "pooled patches then image_newline) or 'flat' (no image_newline)"
        )
    stride = raw.get("mm_spatial_pool_stride")
    mode = raw.get("mm_spatial_pool_mode")
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int)):
        raise CheckpointError(
            f"{name}: config.json 'mm_spatial_pool_stride' is {stride!r}; it must be an integer (2: LaViDa's 2x2 "
            "pooling, 1: none) or null"
        )
    if mode is not None and not isinstance(mode, str):
        raise CheckpointError(f"{name}: config.json 'mm_spatial_pool_mode' is {mode!r}; it must be a string such as "
                              "'bilinear'")
    return {
        "select_layer": SELECT_LAYER,
        "pool_stride": DEFAULT_POOL_STRIDE if stride is None else stride,
        "pool_mode": mode or DEFAULT_POOL_MODE,
    }


def lavida_anyres(raw: dict[str, Any], crop: int) -> AnyresConfig | None:
    """LaViDa's anyres tiling from config.json (None unless image_aspect_ratio is "anyres"): the pinpoints, absent ->
    LaViDa's own. Only plain "anyres" with spatial_unpad is LaViDa's (anyres_max_N is LLaVA-OneVision's)."""
    aspect = raw.get("image_aspect_ratio")
    if not (isinstance(aspect, str) and aspect.startswith("anyres")):
        return None
    merge = raw.get("mm_patch_merge_type") or "flat"
    if aspect != "anyres" or not (isinstance(merge, str) and "unpad" in merge):
        raise ConfigError(f"image_aspect_ratio '{aspect}' with mm_patch_merge_type '{merge}' is not LaViDa's tiling; "
                          "LaViDa uses 'anyres' with 'spatial_unpad'")
    pinpoints = raw.get("image_grid_pinpoints")
    return parse_pinpoints(GRID_PINPOINTS if pinpoints is None else pinpoints, crop)


def lavida_config_keys(variant: str, pool_stride: int, pool_mode: str) -> dict[str, Any]:
    """The LaViDa-specific config.json keys of a checkpoint we write (as LaViDa's training script saves them)."""
    types = {v: k for k, v in MODEL_TYPES.items()}
    archs = {v: k for k, v in ARCHITECTURES.items()}
    return {
        "model_type": types[variant],
        "architectures": [archs[variant]],
        "mm_spatial_pool_mode": pool_mode,
        "mm_spatial_pool_stride": None if pool_stride == DEFAULT_POOL_STRIDE else pool_stride,
        "mm_pooler_ratio": 2,
        "mm_newline_position": "grid",  # train.py's default; it only shapes video features
        "image_grid_pinpoints": GRID_PINPOINTS,
        "mm_resampler_type": None,
    }
