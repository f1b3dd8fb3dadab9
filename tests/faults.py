"""Fault injection for the export checks: random checkpoints whose outputs are flat or peaked, and weights replaced,
as the export writes them, by unrelated noise of the same spread (the torch reference still reads the checkpoint).

The flat model is the issue's: a random initialisation of std 0.02 over a vocabulary of 32,768 (every token's
probability near 1/32,768 at every position). Its peaked twin is the same model with the LM head 50 times larger
(std 1.0): the same layers, most of each position's probability on a few tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from seer_deploy.export.streamed_weights import ExportedWeight
from seer_deploy.models.checkpoints.checkpoint import checkpoint_weights, save_checkpoint
from seer_deploy.models.checkpoints.weight_sources import weight_sources
from seer_deploy.models.demos.demo_tasks import write_tokenizer

SHAPE = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden": 128, "vocab_size": 32768,
         "max_seq_len": 64}
STD = 0.02
PEAKED_HEAD_STD = 1.0

# Which weights a fault replaces, by their names inside the model (models.weight_sources).
FAULTS: dict[str, Callable[[str], bool]] = {
    "one projection": lambda name: name == "layers.1.mlp.up.weight",
    "all projections": lambda name: name.startswith("layers.") and name.endswith(".weight") and "norm" not in name,
    "the LM head": lambda name: name == "lm_head.weight",
    "the embedding": lambda name: name == "embed.weight",
    "every projection and the LM head": lambda name: name == "lm_head.weight" or (
        name.startswith("layers.") and "norm" not in name),
}


def random_checkpoint(root: Path, peaked: bool) -> Path:
    """The flat model (std 0.02 everywhere) or its peaked twin (the same, the LM head at std 1.0)."""
    root.mkdir(parents=True, exist_ok=True)
    write_tokenizer(root / "tokenizer.json")
    model = tiny_model(0, **SHAPE)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, PEAKED_HEAD_STD if peaked and name == "lm_head.weight" else STD)
    return save_checkpoint(model, root / ("peaked" if peaked else "flat"), "llada", tokenizer_file=root / "tokenizer.json")


def inject(monkeypatch: pytest.MonkeyPatch, checkpoint: Path, fault: str) -> list[str]:
    """Make the export write unrelated noise (normal, each tensor's own std, seeded by its name) for the weights
    `fault` names; the checkpoint itself, which the torch reference reads, is left alone. Returns their names."""
    chosen = {source.name: internal for internal, source in weight_sources(checkpoint_weights(checkpoint)).items()
              if FAULTS[fault](internal)}
    real = ExportedWeight.tensor

    def noisy(self: ExportedWeight) -> torch.Tensor:
        tensor = real(self)
        if self.source.name not in chosen:
            return tensor
        seed = int.from_bytes(hashlib.sha256(self.source.name.encode()).digest()[:4], "little")
        noise = torch.randn(tensor.shape, generator=torch.Generator().manual_seed(seed))
        return (noise * tensor.float().std()).to(tensor.dtype)

    monkeypatch.setattr(ExportedWeight, "tensor", noisy)
    return sorted(chosen.values())
