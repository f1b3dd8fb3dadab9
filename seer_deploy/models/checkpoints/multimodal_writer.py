"""Writing LLaVA-style multimodal checkpoints (LLaDA-V's layout, LaViDa-LLaDA's and LaViDa-Dream's) as they ship, for
scripts/train_demo_vl.py and the tests: the runtime only reads them (models.checkpoints.multimodal)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seer_deploy.core.atomic import install_dir, temp_dir_beside
from seer_deploy.core.errors import ConfigError
from seer_deploy.models.checkpoints.checkpoint import SINGLE_FILE, Layout, save_safetensors, weight_name_map
from seer_deploy.models.checkpoints.multimodal import PREPROCESSOR_FILE, VISION_PREFIXES, vision_weight_names
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.families.family_configs import family_config_dict
from seer_deploy.models.families.lavida import LLADA, VARIANT_NAMES, lavida_config_keys
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.vision import VisionConfig, VisionEncoder


def multimodal_config_dict(lm_cfg: ModelConfig, vcfg: VisionConfig, tower_name: str = "local-siglip",
                           lavida: str | None = None) -> dict[str, Any]:
    """config.json of a LLaDA-V-layout checkpoint (Llama-style LM fields), or with `lavida` 'llada' / 'dream' a
    LaViDa one (its LM's public fields and LaViDa's keys), plus LLaVA's mm_* keys and vision_config."""
    if lavida is None:
        d = lm_cfg.config_json("llama")
        d["model_type"] = "llava_llada"
        d["architectures"] = ["LlavaLLaDAModelLM"]
    elif lavida in VARIANT_NAMES:
        if lm_cfg.family != lavida:  # the variants are named after their LM's family
            raise ConfigError(f"a {VARIANT_NAMES[lavida]} checkpoint needs a {lavida} language model, not "
                              f"{lm_cfg.family}")
        d = family_config_dict(lm_cfg)  # the LM's own public fields (LLaDA's d_model..., Dream's Qwen2 ones)
        d.pop("auto_map", None)  # LaViDa's classes are registered by its code, not by auto_map
        d.update(lavida_config_keys(lavida, vcfg.pool_stride, vcfg.pool_mode))
    else:
        raise ConfigError(f"LaViDa variant {lavida!r} is unknown; use one of {', '.join(VARIANT_NAMES)}")
    d.update(
        {
            "mm_vision_tower": tower_name,
            "mm_projector_type": vcfg.projector_type,
            "mm_vision_select_layer": vcfg.select_layer,
            "mm_vision_select_feature": vcfg.select_feature,
            "mm_hidden_size": vcfg.mm_hidden_size,
            "mm_patch_merge_type": vcfg.patch_merge_type,
            "image_aspect_ratio": vcfg.image.aspect,
            "image_token_index": vcfg.image_token_index,
            "use_mm_proj": True,
            "vision_config": {"model_type": "siglip_vision_model", **vcfg.siglip},
        }
    )
    return d


def save_multimodal_checkpoint(
    lm: MaskPredictor,
    vision: VisionEncoder,
    path: str | os.PathLike[str],
    *,
    tokenizer_file: str | os.PathLike[str] | None = None,
    extra_files: dict[str, str] | None = None,
    dtype: torch.dtype | None = None,
    unused_layers: bool = False,
    lavida: str | None = None,
) -> Path:
    """Write a LLaDA-V-layout checkpoint (one model.safetensors, config.json, preprocessor_config.json); with
    `lavida` 'llada' a LaViDa-LLaDA one (LLaDA's weight names and config fields, LaViDa's model_type and keys), with
    'dream' a LaViDa-Dream one (Dream's Qwen2 names and fields: `lm` must be a Dream-family model).

    The tower is stored as LLaVA-OneVision stores it: the layers that run and the (unused) post-layernorm.
    unused_layers=True adds layers past the selected one (copies of the last layer that runs, never read), as a
    checkpoint of the full SigLIP tower would hold them.
    Written to a temporary directory next to `path` and renamed into place.
    """
    vcfg = vision.cfg
    if lm.cfg.d_model != vcfg.lm_hidden_size:
        raise ConfigError(f"the projector outputs {vcfg.lm_hidden_size} wide embeddings but the LM is {lm.cfg.d_model} wide")
    dest = Path(path)
    tmp = temp_dir_beside(dest, "write")
    try:
        lm_params = dict(lm.named_parameters())
        config = multimodal_config_dict(lm.cfg, vcfg, lavida=lavida)  # refuses a variant it cannot write
        layout: Layout = "llada" if lavida == LLADA else "llama"  # LLaDA-V and LaViDa-Dream: model.layers.N...
        tensors: dict[str, Tensor] = {ext: lm_params[internal] for internal, ext in weight_name_map(lm.cfg, layout).items()}
        v_params = dict(vision.named_parameters())
        tensors.update({ext: v_params[internal] for internal, ext in vision_weight_names(vision).items()})
        if unused_layers:
            tensors.update(_unused_layers(vision))
        out = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in tensors.items()}
        save_safetensors(out, tmp / SINGLE_FILE)
        config["torch_dtype"] = str(next(iter(out.values())).dtype).removeprefix("torch.")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        proc = {
            "image_processor_type": "SiglipImageProcessor",
            "image_mean": list(vcfg.image.mean),
            "image_std": list(vcfg.image.std),
            "size": {"height": vcfg.image.image_size, "width": vcfg.image.image_size},
            "resample": 3,
            "rescale_factor": vcfg.image.rescale,
        }
        (tmp / PREPROCESSOR_FILE).write_text(json.dumps(proc, indent=2) + "\n")
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        install_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _unused_layers(vision: VisionEncoder) -> dict[str, Tensor]:
    """Weights for the tower layers past the selected one, named as a full SigLIP checkpoint names them."""
    cfg = vision.cfg
    total = int(cfg.siglip["num_hidden_layers"])
    if cfg.layers_to_run >= total or not len(vision.tower.body.encoder.layers):
        return {}
    template = vision.tower.body.encoder.layers[-1].state_dict()
    out: dict[str, Tensor] = {}
    for i in range(cfg.layers_to_run, total):
        for k, v in template.items():
            out[f"{VISION_PREFIXES[0]}encoder.layers.{i}.{k}"] = v.clone()
    return out
