"""LLaVA-style multimodal checkpoints (LLaDA-V, LaViDa): layout and loading (which checkpoints are multimodal,
without torch: models.checkpoints.multimodal_files; prompts with pictures: models.prompts.image_placeholders; writing one, for the demo's
training script and the tests: models.checkpoints.multimodal_writer).

Layout: a language model loaded by `load_checkpoint` (LLaDA-V: Llama-style `model.layers.N...`, `model.embed_tokens`,
`model.norm`, `lm_head`; LaViDa-LLaDA: LLaDA's `model.transformer.blocks.N...`; models.families.lavida) plus LLaVA's names for
the vision side: `model.vision_tower.vision_tower.vision_model.*` (SigLIP),
`model.mm_projector.{0,2,...}.*` and `model.image_newline`, with LLaVA's config keys (`mm_vision_tower`,
`mm_projector_type`, `mm_vision_select_layer`, `mm_vision_select_feature`, `mm_hidden_size`, `mm_patch_merge_type`,
`image_aspect_ratio`, `image_token_index`). The SigLIP config is read from `vision_config` in config.json, from a local
directory named by `mm_vision_tower`, or, for the published so400m towers, from their known shape (never downloaded;
LaViDa builds every SigLIP tower with the so400m shape, whatever path its config names).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from seer_deploy.core.checks import ascii_int
from seer_deploy.core.errors import CheckpointError
from seer_deploy.core.files import confined, read_json
from seer_deploy.models.checkpoints.checkpoint import (
    WithLanguageModel,
    finite_weight,
    load_checkpoint,
    read_config,
    weight_files,
)
from seer_deploy.models.checkpoints.multimodal_files import (
    DEMO_VL_NAME,  # noqa: F401  (the exporter's and cli.demo's import)
    checkpoint_directory,
    is_multimodal,
)
from seer_deploy.models.families.config import config_from_dict
from seer_deploy.models.families.lavida import (
    lavida_anyres,
    lavida_variant,
    lavida_vision_fields,
)
from seer_deploy.models.networks.vision import VisionConfig, VisionEncoder
from seer_deploy.models.pictures.image import SIGLIP_MEAN, SIGLIP_STD, ImageConfig

LLAVA_IMAGE_TOKEN_INDEX = -200  # LLaVA's IMAGE_TOKEN_INDEX: the placeholder id in prompt ids
# Where LLaVA-family checkpoints keep the SigLIP weights: transformers 4.x names (vision_model.*) first, then 5.x.
VISION_PREFIXES: tuple[str, ...] = ("model.vision_tower.vision_tower.vision_model.", "model.vision_tower.vision_tower.")
PROJECTOR_PREFIX = "model.mm_projector."
NEWLINE_NAME = "model.image_newline"
PREPROCESSOR_FILE = "preprocessor_config.json"
# The published SigLIP so400m towers (LLaVA-OneVision, LLaDA-V): their shape, so a checkpoint that only names
# the tower still loads without a download. Weights always come from the checkpoint itself.
KNOWN_TOWERS: dict[str, dict[str, Any]] = {
    name: {
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_channels": 3,
        "image_size": 384,
        "patch_size": 14,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    }
    for name in ("google/siglip-so400m-patch14-384", "google/siglip2-so400m-patch14-384")
}
KNOWN_TOWERS_LAVIDA = "google/siglip-so400m-patch14-384"
_SIGLIP_TYPES = ("siglip_vision_model", "siglip", "siglip2_vision_model")


def _tower_fields(raw: dict[str, Any], path: Path | None) -> dict[str, Any]:
    name = raw.get("mm_vision_tower") or raw.get("vision_tower")
    if lavida_variant(raw) is not None and isinstance(name, str) and "siglip" in name and not (
            isinstance(raw.get("vision_config"), dict) or _local_tower(name, path) is not None):
        name = KNOWN_TOWERS_LAVIDA  # LaViDa's SigLipVisionTower is always so400m (its config's defaults)
    vc = raw.get("vision_config")
    if isinstance(vc, dict):
        fields = dict(vc)
    elif isinstance(name, str) and _local_tower(name, path) is not None:
        tower_cfg = _local_tower(name, path)
        assert tower_cfg is not None
        loaded = read_json(tower_cfg, "vision tower config", error=CheckpointError)
        tower = loaded.get("vision_config", loaded)
        if not isinstance(tower, dict):
            raise CheckpointError(f"{tower_cfg}: 'vision_config' must be an object; fix the vision tower config")
        fields = dict(tower)
    elif isinstance(name, str) and name in KNOWN_TOWERS:
        fields = dict(KNOWN_TOWERS[name])
    else:
        raise CheckpointError(
            f"config.json names the vision tower {name!r} but holds no 'vision_config'; add the tower's SigLIP config "
            "(hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, image_size, patch_size) as "
            "'vision_config' to config.json, or point mm_vision_tower at a local directory with its config.json"
        )
    model_type = fields.get("model_type")
    if model_type is not None and model_type not in _SIGLIP_TYPES:
        raise CheckpointError(
            f"vision tower model_type '{model_type}' is not supported; seer-deploy runs SigLIP-family towers "
            f"({', '.join(_SIGLIP_TYPES)})"
        )
    return fields


def _local_tower(name: str, path: Path | None) -> Path | None:
    """The config.json of a tower that mm_vision_tower names inside the checkpoint directory; never a directory
    outside it (a name that leads outside is taken as a hub name, which is never downloaded)."""
    if path is None:
        return None
    try:
        candidate = confined(path, name, "vision tower", error=CheckpointError) / "config.json"
    except CheckpointError:
        return None
    return candidate if candidate.is_file() else None


def _image_config(raw: dict[str, Any], siglip: dict[str, Any], path: Path | None, tiled: bool = False) -> ImageConfig:
    """Mean/std/size from preprocessor_config.json when the checkpoint has one, else config.json, else SigLIP's;
    `tiled` (anyres): every view is a tower-sized square resized as is."""
    proc: dict[str, Any] = {}
    if path is not None and (path / PREPROCESSOR_FILE).is_file():
        proc = read_json(path / PREPROCESSOR_FILE, "image preprocessor config", error=CheckpointError)
    mean = proc.get("image_mean", raw.get("image_mean", siglip.get("image_mean", SIGLIP_MEAN)))
    std = proc.get("image_std", raw.get("image_std", siglip.get("image_std", SIGLIP_STD)))
    aspect = "square" if tiled else raw.get("image_aspect_ratio") or "square"
    return ImageConfig(
        image_size=int(siglip["image_size"]),
        mean=tuple(float(v) for v in mean),  # type: ignore[arg-type]
        std=tuple(float(v) for v in std),  # type: ignore[arg-type]
        aspect=str(aspect),
    )


def vision_config_from_dict(raw: dict[str, Any], path: Path | None = None) -> VisionConfig:
    """The vision side of a LLaVA-style config.json (CheckpointError / ConfigError naming what is wrong)."""
    if not is_multimodal(raw):
        raise CheckpointError(
            "config.json describes no vision tower (no mm_vision_tower or vision_config): not a multimodal "
            "(LLaDA-V-style) checkpoint; use it without --image"
        )
    variant = lavida_variant(raw)
    lavida = lavida_vision_fields(raw, variant) if variant is not None else {}  # checked before anything loads
    siglip = _tower_fields(raw, path)
    lm = config_from_dict(raw)
    anyres = lavida_anyres(raw, int(siglip["image_size"])) if variant is not None else None
    return VisionConfig(
        siglip=siglip,
        lm_hidden_size=lm.d_model,
        mm_hidden_size=raw.get("mm_hidden_size") or siglip.get("hidden_size", 0),
        image=_image_config(raw, siglip, path, tiled=anyres is not None),
        select_layer=lavida.get("select_layer", raw.get("mm_vision_select_layer", -2)),
        select_feature=str(raw.get("mm_vision_select_feature") or "patch"),
        projector_type=str(raw.get("mm_projector_type") or "linear"),
        patch_merge_type=str(raw.get("mm_patch_merge_type") or "flat"),
        image_token_index=raw.get("image_token_index", LLAVA_IMAGE_TOKEN_INDEX),
        pool_stride=lavida.get("pool_stride", 1),
        pool_mode=lavida.get("pool_mode", "bilinear"),
        anyres=anyres,
    )


@dataclass
class LoadedMultimodal(WithLanguageModel):
    """A multimodal checkpoint (LLaDA-V, LaViDa): the language model and the vision encoder."""

    vision: VisionEncoder
    vision_config: VisionConfig


def load_multimodal(
    name_or_path: str | os.PathLike[str], dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LoadedMultimodal:
    """Load a LLaDA-V-layout checkpoint: language model, SigLIP tower, projector (and image_newline)."""
    path = checkpoint_directory(name_or_path)
    raw = read_config(path)
    vcfg = vision_config_from_dict(raw, path)
    lm = load_checkpoint(path, dtype=dtype, device=device)
    vision = load_vision(path, vcfg, dtype=dtype, device=device)
    return LoadedMultimodal(lm=lm, vision=vision, vision_config=vcfg)


def vision_weight_names(encoder: VisionEncoder, prefix: str = VISION_PREFIXES[0]) -> dict[str, str]:
    """Internal parameter name (of VisionEncoder) -> checkpoint name, for every weight a checkpoint must hold."""
    names = {f"tower.body.{k}": prefix + k for k, _ in encoder.tower.body.named_parameters()}
    names.update({f"projector.{k}": PROJECTOR_PREFIX + k for k, _ in encoder.projector.named_parameters()})
    if encoder.image_newline is not None:
        names["image_newline"] = NEWLINE_NAME
    return names


def load_vision(
    path: Path, cfg: VisionConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> VisionEncoder:
    """Build the VisionEncoder and fill it from the checkpoint's vision-tower / projector / newline weights."""
    files = weight_files(path)
    prefix = next((p for p in VISION_PREFIXES if p + "embeddings.patch_embedding.weight" in files), None)
    if prefix is None:
        raise CheckpointError(
            f"{path}: no vision tower weights (expected {VISION_PREFIXES[0]}embeddings.patch_embedding.weight and the "
            "encoder layers); the checkpoint is text-only or uses an unknown vision layout"
        )
    with torch.device(device):
        encoder = VisionEncoder(cfg)
    expected = vision_weight_names(encoder, prefix)
    optional = {n for n in expected if n.startswith("tower.body.post_layernorm.")}  # unused by LLaVA's features
    missing = sorted(expected[n] for n in expected if expected[n] not in files and n not in optional)
    if missing:
        raise CheckpointError(f"{path}: missing vision weights: {_short(missing)}")
    used_layers = cfg.layers_to_run
    unexpected = []
    for name in files:
        if not name.startswith((prefix, PROJECTOR_PREFIX, NEWLINE_NAME)) or name in expected.values():
            continue
        rest = name[len(prefix) :] if name.startswith(prefix) else ""
        if rest.startswith("head.") or _layer_index(rest) >= used_layers:
            continue  # LLaVA drops the pooling head; layers past the selected one never run
        unexpected.append(name)
    if unexpected:
        raise CheckpointError(f"{path}: unexpected vision weights for this config: {_short(sorted(unexpected))}")
    params = dict(encoder.named_parameters())
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for internal, external in expected.items():
        if external in files:
            by_file.setdefault(files[external], []).append((internal, external))
    with torch.no_grad():
        for file, pairs in by_file.items():
            try:
                with safe_open(file, framework="pt", device="cpu") as f:
                    for internal, external in pairs:
                        tensor = f.get_tensor(external)
                        if tuple(tensor.shape) != tuple(params[internal].shape):
                            raise CheckpointError(
                                f"{path}: weight {external} has shape {tuple(tensor.shape)}, but the vision config "
                                f"implies {tuple(params[internal].shape)}; the config and the weights disagree"
                            )
                        params[internal].copy_(finite_weight(tensor, external, file))
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); re-download or re-save it") from exc
    return encoder.to(dtype=dtype).eval().requires_grad_(False)


def _layer_index(rest: str) -> int:
    """N for 'encoder.layers.N.*', else -1."""
    parts = rest.split(".")
    index = ascii_int(parts[2]) if len(parts) > 2 and parts[0] == "encoder" and parts[1] == "layers" else None
    return index if index is not None and index >= 0 else -1


def _short(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")
