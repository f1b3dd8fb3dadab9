"""A tiny Dimple checkpoint written from the public facts (tests/public_facts.py): Dream's language model under
Dream's names, Qwen2.5-VL's tower under `visual.*` (transformers' names), Dimple's `img_projector.*`, DimpleConfig's
config.json keys (shrunk), Qwen2.5-VL's preprocessor_config.json, Dream's Qwen2 tokenizer files as they ship."""

from __future__ import annotations

import functools
import json
import types
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from public_facts import (
    DIMPLE_CONFIG,
    DIMPLE_PREPROCESSOR,
    DIMPLE_SHRUNK,
    DREAM_ADDED,
    DREAM_GENERATION,
    DREAM_SPECIAL_MAP,
    DREAM_TOKENIZER_CONFIG,
    shrunk,
    write_bpe,
)
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.families.config import config_from_dict
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.qwen_vision import DimpleVisionEncoder, QwenTowerConfig

CONFIG = shrunk(DIMPLE_CONFIG, DIMPLE_SHRUNK)


def randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Weights far from their init (norms and biases too), so that every tensor loaded matters."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(1.0 if "norm" in name or "ln_q" in name else 0.0, 0.3 if p.dim() > 1 else 0.1)
    return module.eval()


def write_dimple(root: Path, seed: int = 0, **changes: object) -> tuple[Path, MaskPredictor, DimpleVisionEncoder]:
    """The checkpoint directory, and the language model and vision encoder it holds (`changes`: config.json keys
    other than the shrunk public ones, e.g. num_hidden_layers)."""
    path = root / "dimple"
    config = {**CONFIG, **changes}
    cfg = config_from_dict(config)
    lm = randomised(MaskPredictor(cfg), seed)
    vision = randomised(DimpleVisionEncoder(QwenTowerConfig.from_dict(CONFIG["vision_config"]), cfg.d_model), seed + 1)
    assert isinstance(lm, MaskPredictor) and isinstance(vision, DimpleVisionEncoder)
    save_checkpoint(lm, path, "llama", extra_tensors=dict(vision.state_dict()))
    write_bpe(path, DREAM_ADDED[0][0])
    files = {"config.json": config, "preprocessor_config.json": DIMPLE_PREPROCESSOR,
             "generation_config.json": DREAM_GENERATION, "special_tokens_map.json": DREAM_SPECIAL_MAP,
             "tokenizer_config.json": DREAM_TOKENIZER_CONFIG,
             "added_tokens.json": {c: i for i, c, _ in DREAM_ADDED}}
    for name, data in files.items():
        (path / name).write_text(json.dumps(data, indent=2))
    return path, lm, vision


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed * 7919 + width * height)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def qwen_rope_index(ids: torch.Tensor, grids: list[tuple[int, int, int]], mask: torch.Tensor | None = None,
                    image_pad: int = 151655) -> torch.Tensor:
    """transformers' Qwen2-VL get_rope_index (5.x: image tokens marked by mm_token_type_ids) on Qwen's own ids."""
    owner = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=types.SimpleNamespace(
        spatial_merge_size=2)))
    owner.get_vision_position_ids = functools.partial(Qwen2VLModel.get_vision_position_ids, owner)
    positions, _ = Qwen2VLModel.get_rope_index(owner, ids, (ids == image_pad).int(), torch.tensor(grids),
                                               attention_mask=mask)
    return positions
