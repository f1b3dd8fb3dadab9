"""Which checkpoints take pictures and where they live, read from config.json alone (no torch): what the
runtime needs to route a target and find its files; loading them is `models.checkpoints.multimodal`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import CheckpointError
from seer_deploy.core.files import read_json
from seer_deploy.models.checkpoints.checkpoint_files import resolve_checkpoint
from seer_deploy.models.families.families import IMAGES_UNSUPPORTED, detect_family

DEMO_VL_NAME = "demo-vl"
DEMO_VL_DIR = Path(__file__).parents[1] / "demos" / "demo_vl"  # a hyphen is not importable, so 'demo-vl' resolves here
IMAGE_TOKEN = "<image>"


def is_multimodal(raw: dict[str, Any]) -> bool:
    """True for LLaVA-style configs (a vision tower is named or described) whose tower seer-deploy runs: Dimple's
    config describes its Qwen2.5-VL tower, which is not implemented, so a Dimple checkpoint is a text model here
    (its pictures are refused with the reason, `families.IMAGES_UNSUPPORTED`)."""
    if detect_family(raw) in IMAGES_UNSUPPORTED:
        return False
    return bool(raw.get("mm_vision_tower") or raw.get("vision_tower") or isinstance(raw.get("vision_config"), dict))


def is_multimodal_checkpoint(name_or_path: str | os.PathLike[str]) -> bool:
    """True for 'demo-vl' and checkpoint directories whose config.json describes a vision tower."""
    if str(name_or_path) == DEMO_VL_NAME:
        return True
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        return False
    return is_multimodal(read_json(path / "config.json", "checkpoint config", error=CheckpointError))


def checkpoint_directory(name_or_path: str | os.PathLike[str]) -> Path:
    """The directory a checkpoint name stands for: 'demo' and 'demo-vl' the bundled demos, anything else a local path
    (`resolve_checkpoint`)."""
    if str(name_or_path) == DEMO_VL_NAME:
        return DEMO_VL_DIR
    return resolve_checkpoint(name_or_path)
