"""The public model families and what each one's `config.json` means for the mask predictor.

A family is told from `model_type` and `architectures` (LLaDA-MoE shares model_type "llada" with LLaDA, so its
architecture or `num_experts` tells it apart). Each family maps to a few ModelConfig options (models.families.config), and
anything the mask predictor does not implement is refused here, by name, before a weight is read:

| family    | public checkpoints                       | options                                                      |
|-----------|------------------------------------------|--------------------------------------------------------------|
| llada     | LLaDA-8B-Base/Instruct, LLaDA 1.5, LLaDA-V's LM | none (the defaults)                                   |
| mmada     | MMaDA-8B (LLaDA's layout)                | image_codes: 8,192 VQ image codes after the text vocabulary  |
| dream     | Dream-v0-Instruct-7B (Qwen2 names)       | qkv_bias, shift_logits, grouped-query attention              |
| dimple    | Dimple-7B (Dream's LM + Qwen2.5-VL tower)| as dream; the vision tower is not implemented (text only)   |
| llada_moe | LLaDA-MoE-7B-A1B                         | num_experts / experts_per_token, qk_norm, rotary_dim         |

models.families.family_configs writes a family's public config.json back (the tiny test checkpoints use it).
"""

from __future__ import annotations

from typing import Any

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.models.families.lavida import lavida_variant

# config.json model_type -> family. LLaVA-style wrappers (LLaDA-V, LaViDa) name the family of their language model.
MODEL_TYPES: dict[str, str] = {
    "llada": "llada",
    "llada_llama": "llada",
    "llava_llada": "llada",
    "mmada": "mmada",
    "Dream": "dream",
    "dream": "dream",
    "llava_dream": "dream",
    "dimple": "dimple",
    "lladamoe": "llada_moe",
    "llada_moe": "llada_moe",
}
# A word of `architectures` -> family, for configs whose model_type is absent or shared.
ARCHITECTURES: tuple[tuple[str, str], ...] = (
    ("LLaDAMoE", "llada_moe"), ("MMada", "mmada"), ("Dimple", "dimple"), ("Dream", "dream"),
)
FAMILIES: tuple[str, ...] = ("llada", "mmada", "dream", "dimple", "llada_moe")
MMADA_CODEBOOK = 8192  # MAGVIT-v2 codes MMaDA-8B adds to LLaDA's vocabulary
# LaViDa generates with prefix-DLM attention (its predict.py passes prefix_lm=True): on for LaViDa checkpoints, whose
# config.json has no key for it; the torch loops, the exported graphs and every engine pass prompt_width.
LAVIDA_PREFIX_DEFAULT = True
DIMPLE_VISION_PREFIXES = ("visual.", "img_projector.", "model.visual.", "model.img_projector.")


def detect_family(raw: dict[str, Any]) -> str:
    """The family of a config.json, or CheckpointError naming an unsupported model_type."""
    archs = raw.get("architectures") or []
    archs = [a for a in ([archs] if isinstance(archs, str) else archs) if isinstance(a, str)]
    model_type = raw.get("model_type")
    for word, family in ARCHITECTURES:
        if any(word in a for a in archs):
            return family
    if model_type in (None, "llada") and raw.get("num_experts"):
        return "llada_moe"
    if model_type is None:
        return "llada"
    if model_type not in MODEL_TYPES:
        known = ", ".join(sorted(MODEL_TYPES))
        raise CheckpointError(f"config.json model_type {model_type!r} is not supported; seer-deploy loads {known}")
    return MODEL_TYPES[model_type]


def family_keys(family: str) -> dict[str, str]:
    """ModelConfig field -> config.json key, where a family names a field differently from its field style."""
    return {"mlp_hidden": "expert_intermediate_size"} if family == "llada_moe" else {}


def check_family(family: str, raw: dict[str, Any]) -> None:
    """CheckpointError naming the first config.json setting of `family` that the mask predictor does not implement
    (before any other field is read)."""
    if raw.get("rope_scaling") is not None:
        raise CheckpointError(f"config.json rope_scaling {raw['rope_scaling']!r} is not supported (plain rotary "
                              "embeddings only); remove it or use a checkpoint without rope scaling")
    if family in ("dream", "dimple") and raw.get("use_sliding_window"):
        raise CheckpointError("config.json use_sliding_window=true is not supported (attention is bidirectional "
                              "over the whole sequence); set it to false")
    if family == "llada" and raw.get("attention_bias"):
        raise CheckpointError("config.json attention_bias=true is not supported for LLaDA (its blocks have no "
                              "biases); set it to false")
    if family == "llada_moe":
        _check_moe(raw)


def family_options(family: str, raw: dict[str, Any], head_dim: int, vocab_size: int,
                   text_tokens: int | None = None) -> dict[str, Any]:
    """The ModelConfig options of `family` from its config.json fields (checked by `check_family`). MMaDA's image
    codes start at `text_tokens`, the length of its text tokenizer, as Gen-Verse/MMaDA inference_mmu.py offsets
    them (llm_vocab_size without a tokenizer). LLaDA-MoE's top-k weights are never renormalised: its public
    modeling code (modeling_lladamoe.py, LLaDAMoESparseMoeBlock) fixes norm_topk_prob to False whatever
    config.json says."""
    options: dict[str, Any] = {"family": family}
    if family in ("dream", "dimple"):
        options.update(qkv_bias=True, shift_logits=True)
    elif family == "mmada":
        codes = raw.get("codebook_size", MMADA_CODEBOOK)
        base = text_tokens if text_tokens is not None else raw.get(
            "llm_vocab_size", vocab_size - codes if isinstance(codes, int) else None)
        options.update(image_codes=codes, image_code_base=base)
    elif family == "llada_moe":
        factor = raw.get("partial_rotary_factor", 1.0)
        options.update(num_experts=raw["num_experts"], experts_per_token=raw["num_experts_per_tok"],
                       norm_topk_prob=False,
                       qk_norm=bool(raw.get("qk_layernorm", True)),
                       rotary_dim=None if factor == 1 else int(head_dim * factor))
    return options


def prefix_dlm_setting(raw: dict[str, Any]) -> bool:
    """Whether a (top-level) config.json asks for prefix-DLM attention: an explicit boolean "prefix_dlm" (or LaViDa's
    generate() name "prefix_lm") wins; otherwise LAVIDA_PREFIX_DEFAULT for LaViDa checkpoints, which generate with
    prefix_lm=True (LaViDa's config.json has no such key), off for every other model."""
    for key in ("prefix_dlm", "prefix_lm"):
        if isinstance(raw.get(key), bool):
            return bool(raw[key])
    return LAVIDA_PREFIX_DEFAULT and lavida_variant(raw) is not None


def _check_moe(raw: dict[str, Any]) -> None:
    """LLaDA-MoE: every layer an MoE of SwiGLU experts with a softmax top-k router, no shared expert."""
    unsupported = {
        "shared_expert_intermediate_size": raw.get("shared_expert_intermediate_size") not in (None, 0),
        "moe_router_enable_expert_bias": bool(raw.get("moe_router_enable_expert_bias")),
        "router_num_group": raw.get("router_num_group") not in (None, 0, 1),
        "routed_scaling_factor": raw.get("routed_scaling_factor", 1) != 1,
        "moe_layer_freq": any(v != 1 for v in raw.get("moe_layer_freq") or [])
        if isinstance(raw.get("moe_layer_freq"), list) else raw.get("moe_layer_freq", 1) != 1,
    }
    for key, refused in unsupported.items():
        if refused:
            raise CheckpointError(f"config.json {key}={raw[key]!r} is not supported for LLaDA-MoE (routed experts "
                                  "only: no shared expert, expert bias, router groups or scaling, every layer MoE)")
    score = raw.get("moe_router_score_function")
    if score not in (None, "softmax"):
        raise CheckpointError(f"config.json moe_router_score_function={score!r} is not supported for LLaDA-MoE (the "
                              "router is a softmax over the experts, as its public code runs it); use 'softmax'")
    if raw.get("clip_qkv") is not None:
        raise CheckpointError(f"config.json clip_qkv={raw['clip_qkv']!r} is not supported for LLaDA-MoE (queries, keys "
                              "and values are not clamped); set it to null")
    for key in ("num_experts", "num_experts_per_tok", "expert_intermediate_size"):
        if raw.get(key) is None:
            raise CheckpointError(f"config.json (LLaDA-MoE) is missing '{key}'; add it to the checkpoint's config.json")
    factor = raw.get("partial_rotary_factor", 1.0)
    if not isinstance(factor, int | float) or isinstance(factor, bool) or not 0 < factor <= 1:
        raise CheckpointError(f"config.json partial_rotary_factor {factor!r} must be a number in (0, 1]")


# Families whose vision tower seer-deploy does not implement: their checkpoints run text prompts, and a picture given
# to one is refused with this reason (before anything loads).
IMAGES_UNSUPPORTED: dict[str, str] = {
    "dimple": "Dimple's vision tower is not implemented (Qwen2.5-VL: Conv3d patches, windowed attention, M-RoPE, patch "
              "merger): seer-deploy runs Dimple on text prompts only; drop the images",
}


def check_images_supported(raw: dict[str, Any]) -> None:
    """ConfigError, one line, for a family whose vision tower seer-deploy does not implement (Dimple); None else.
    The language model still runs text prompts."""
    reason = IMAGES_UNSUPPORTED.get(detect_family(raw))
    if reason is not None:
        raise ConfigError(reason)
