"""Checkpoint layouts, configuration, the mask predictor, the tokenizer and the bundled demo."""

from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.models.checkpoint import LoadedCheckpoint, load_checkpoint, resolve_checkpoint, save_checkpoint
from seer_deploy.models.config import ModelConfig
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.models.tokenizer import Tokenizer

__all__ = [
    "LoadedCheckpoint",
    "MaskPredictor",
    "ModelConfig",
    "StatsSpec",
    "Tokenizer",
    "load_checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
]
