"""The export's own check at a moderate size: a random model of about 17M parameters (LLaDA's layout, an MLP four
times wider than the demo's) exports with default flags in float32 and float16 and passes its check against torch,
while a graph that computes something else is caught, kept and marked unverified (exit 1 on the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.core.errors import UnverifiedExport
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.streamed_weights import ExportedWeight
from seer_deploy.export.validate import NOISE_FACTOR, TOLERANCES
from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer

MODERATE = {"d_model": 512, "n_layers": 4, "n_heads": 8, "n_kv_heads": 8, "mlp_hidden": 1408, "vocab_size": 4096,
            "max_seq_len": 96}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("moderate")
    write_tokenizer(root / "tokenizer.json")
    model = tiny_model(0, **MODERATE)
    with torch.no_grad():  # LLaDA-like scales: a wide MLP at the demo's 0.2 init would saturate every softmax
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.04)
    return save_checkpoint(model, root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_moderate_model_passes_its_own_check(checkpoint: Path, tmp_path: Path, dtype: str) -> None:
    cache = dtype == "fp32"  # the cache graphs' check once (CI time)
    result = export_checkpoint(checkpoint, tmp_path / dtype, ExportOptions(dtype=dtype, kv_cache=cache))
    manifest = ExportManifest.load(result.out)
    assert manifest.verified and manifest.dtype == dtype
    diff = result.max_diff
    assert diff["step0 confidence"] > 0 and diff["step confidence"] > 0
    assert ("window_step confidence" in diff) == cache
    if dtype == "fp16":  # what float16 alone moves is measured and recorded, and bounds the check
        noise = diff["fp16 torch itself: probability"]
        assert 0 < diff["step0 confidence"] <= TOLERANCES["fp16"].prob_atol + NOISE_FACTOR * noise


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_broken_graph_is_caught_and_kept_unverified(checkpoint: Path, tmp_path: Path, dtype: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The references come from the checkpoint; the weights file is written with the last MLP's up projection 15%
    off: what a wrong conversion, kernel or fusion in an export would look like."""
    real = ExportedWeight.tensor
    last = f"blocks.{MODERATE['n_layers'] - 1}.up_proj.weight"

    def off(self: ExportedWeight) -> torch.Tensor:
        tensor = real(self)
        return tensor * 1.15 if self.source.name.endswith(last) else tensor

    monkeypatch.setattr(ExportedWeight, "tensor", off)
    with pytest.raises(UnverifiedExport, match="UNVERIFIED.*disagrees with torch"):
        export_checkpoint(checkpoint, tmp_path / "broken", ExportOptions(dtype=dtype))
    manifest = ExportManifest.load(tmp_path / "broken")
    assert manifest.verified is False and "disagrees" in manifest.extra["validation"]["problems"]
