"""Shared fixtures: tiny random LLaDA-style models and checkpoints written in the real layouts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from seer_deploy.models.checkpoints.checkpoint import Layout, save_checkpoint
from seer_deploy.models.demos.demo_tasks import VOCAB, write_tokenizer
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor

DEMO_DIR = Path(__file__).resolve().parents[1] / "seer_deploy" / "models" / "demos" / "demo"


def tiny_config(**overrides: object) -> ModelConfig:
    """A 2-layer model over the demo vocabulary (so the demo tokenizer fits it)."""
    ids = {tok: i for i, tok in enumerate(VOCAB)}
    fields: dict[str, object] = {
        "vocab_size": len(VOCAB),
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "mlp_hidden": 64,
        "max_seq_len": 128,
        "rope_theta": 10000.0,
        "mask_id": ids["<|mdm_mask|>"],
        "eos_id": ids["<|endoftext|>"],
        "pad_id": ids["<|endoftext|>"],
        "bos_id": ids["<|startoftext|>"],
    }
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def tiny_model(seed: int = 0, **overrides: object) -> MaskPredictor:
    torch.manual_seed(seed)
    model = MaskPredictor(tiny_config(**overrides))
    with torch.no_grad():  # larger than default init so predictions differ across positions
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    return model.eval()


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., Path]:
    """Write a tiny random model as a checkpoint directory: make_checkpoint(layout='llada', **save_kwargs)."""

    def make(layout: Layout = "llada", name: str | None = None, model: MaskPredictor | None = None, **kwargs: object) -> Path:
        tok = tmp_path / "tokenizer.json"
        if not tok.exists():
            write_tokenizer(tok)
        out = tmp_path / (name or f"ckpt-{layout}")
        save_checkpoint(model or tiny_model(), out, layout, tokenizer_file=tok, **kwargs)  # type: ignore[arg-type]
        return out

    return make


def demo_available() -> bool:
    return (DEMO_DIR / "model.safetensors").is_file()


requires_demo = pytest.mark.skipif(not demo_available(), reason="the demo checkpoint has not been trained yet")


@pytest.fixture
def cli_exit(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run the CLI in this process: cli_exit(argv) -> (exit code, stdout, stderr)."""
    from seer_deploy.cli import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        out, err = capsys.readouterr()
        return int(exc.value.code or 0), out, err

    return run
