"""Dimple checkpoints with their pictures: Dream's language model (models.checkpoints.checkpoint), Qwen2.5-VL's
vision tower under `visual.*` and Dimple's projector under `img_projector.*` (models.networks.qwen_vision), the
tower config in config.json's `vision_config`, the image processor's settings in preprocessor_config.json (Qwen's
defaults without one), the picture ids in config.json (`image_token_id`, `vision_start_token_id`, ...)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from seer_deploy.core.checks import int_in
from seer_deploy.core.errors import CheckpointError
from seer_deploy.core.files import read_json
from seer_deploy.models.checkpoints.checkpoint import WithLanguageModel, finite_weight, load_checkpoint
from seer_deploy.models.checkpoints.checkpoint_files import read_config, resolve_checkpoint, weight_files
from seer_deploy.models.families.families import DIMPLE_IDS, detect_family
from seer_deploy.models.networks.qwen_vision import DimpleVisionEncoder, QwenTowerConfig
from seer_deploy.models.pictures.qwen_pictures import QwenPictureConfig, QwenPictures

PREPROCESSOR_FILE = "preprocessor_config.json"
VISION_PREFIXES = ("visual.", "img_projector.")


def is_dimple(raw: dict[str, Any]) -> bool:
    return detect_family(raw) == "dimple"


def dimple_ids(raw: dict[str, Any]) -> dict[str, int]:
    """The picture ids of a Dimple config.json (DimpleConfig's defaults where it has none)."""
    ids = {key: raw.get(key, default) for key, default in DIMPLE_IDS.items()}
    for key, value in ids.items():
        if not int_in(value, 0, (1 << 31) - 1):
            raise CheckpointError(f"config.json '{key}' is {value!r}; it must be a token id; fix config.json")
    return ids


def tower_config(raw: dict[str, Any]) -> QwenTowerConfig:
    vision = raw.get("vision_config")
    if not isinstance(vision, dict):
        raise CheckpointError("config.json (Dimple) has no 'vision_config' object describing its Qwen2.5-VL tower; "
                              "add it as the checkpoint ships it")
    return QwenTowerConfig.from_dict(vision)


def dimple_pictures(path: Path, raw: dict[str, Any]) -> QwenPictures:
    """How this checkpoint takes pictures, from its files alone (no weights read)."""
    tower = tower_config(raw)
    processor: dict[str, Any] = {}
    if (path / PREPROCESSOR_FILE).is_file():
        processor = read_json(path / PREPROCESSOR_FILE, "image processor config", error=CheckpointError)
    picture = QwenPictureConfig.from_dict(processor, tower.to_dict())
    if (picture.patch_size, picture.merge_size, picture.temporal_patch_size) != (
            tower.patch_size, tower.spatial_merge_size, tower.temporal_patch_size):
        raise CheckpointError(f"{PREPROCESSOR_FILE} cuts patches of {picture.patch_size} px merged "
                              f"{picture.merge_size} x {picture.merge_size}, the tower expects {tower.patch_size} px "
                              f"merged {tower.spatial_merge_size} x {tower.spatial_merge_size}; the files disagree")
    ids = dimple_ids(raw)
    return QwenPictures(picture, tower.geometry, (ids["vision_start_token_id"], ids["vision_end_token_id"]))


@dataclass
class LoadedDimple(WithLanguageModel):
    """A Dimple checkpoint: the language model, the tower + projector, the pictures."""

    vision: DimpleVisionEncoder
    pictures: QwenPictures
    image_token_index: int  # <|image_pad|>: the placeholder each picture's tokens replace


def load_dimple(name_or_path: str | os.PathLike[str], dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> LoadedDimple:
    """The language model, Qwen2.5-VL tower and projector of a Dimple checkpoint (CheckpointError naming a missing,
    unexpected or misshapen tensor)."""
    path = resolve_checkpoint(name_or_path)
    raw = read_config(path)
    pictures = dimple_pictures(path, raw)
    lm = load_checkpoint(path, dtype=dtype, device=device)
    activation = str(raw.get("hidden_act") or "silu")
    with torch.device(device):
        encoder = DimpleVisionEncoder(tower_config(raw), lm.config.d_model, activation)
    _fill(encoder, path)
    return LoadedDimple(lm, encoder.to(dtype=dtype).eval().requires_grad_(False), pictures,
                        dimple_ids(raw)["image_token_id"])


def _fill(encoder: DimpleVisionEncoder, path: Path) -> None:
    """Copy `visual.*` and `img_projector.*` into the encoder: every one present, none extra, shapes equal."""
    files = weight_files(path)
    params = dict(encoder.named_parameters())
    stored = {name for name in files if name.startswith(VISION_PREFIXES)}
    missing, unexpected = sorted(set(params) - stored), sorted(stored - set(params))
    for names, what in ((missing, "missing"), (unexpected, "unexpected")):
        if names:
            more = f" (+{len(names) - 6} more)" if len(names) > 6 else ""
            raise CheckpointError(f"{path}: {what} vision weights for this vision_config: {', '.join(names[:6])}{more}")
    by_file: dict[Path, list[str]] = {}
    for name in params:
        by_file.setdefault(files[name], []).append(name)
    with torch.no_grad():
        for file, names in by_file.items():
            try:
                with safe_open(file, framework="pt", device="cpu") as f:
                    for name in names:
                        tensor = f.get_tensor(name)
                        if tuple(tensor.shape) != tuple(params[name].shape):
                            raise CheckpointError(f"{path}: weight {name} has shape {tuple(tensor.shape)}, but "
                                                  f"vision_config implies {tuple(params[name].shape)}; the config and "
                                                  "the weights disagree")
                        params[name].copy_(finite_weight(tensor, name, file))
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); re-download it") from exc
