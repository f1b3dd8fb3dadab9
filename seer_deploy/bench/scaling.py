"""The cost-scaling workload: step time against sequence length on a LLaDA-shaped model with random weights.

The demo model is so small that fixed per-call costs hide how a step's cost grows with its length. A model large
enough that compute dominates (d_model 1024, 8 layers, by default) shows the curve that truncation moves along,
independent of any model's accuracy: the time of one denoising step at batch `batch` for each length, on torch
eager and on ONNX Runtime (exported once into the work dir, without the torch comparison: the weights are noise),
and next to them ONNX Runtime's cached step (`ort-window`: one block of `window` positions against a refresh's keys
and values of the whole length), what the block-wise KV cache pays per step instead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seer_deploy.core.backend import Backend, CacheBackend, StepInput, WindowInput
from seer_deploy.core.errors import ConfigError
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor

SCALING_BACKENDS: tuple[str, ...] = ("torch", "ort", "ort-window")
PROMPT_TOKENS = 16  # real tokens in front of the masked response at every length


@dataclass(frozen=True)
class ScalingSettings:
    """The random model's shape and the lengths to time."""

    d_model: int = 1024
    n_layers: int = 8
    n_heads: int = 16
    mlp_hidden: int = 2816
    vocab_size: int = 16384
    lengths: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    batch: int = 1
    repeats: int = 3  # timed calls per (backend, length); the median counts
    window: int = 32  # ort-window: the cached step's block (Fast-dLLM's 32)

    def validate(self) -> None:
        if not self.lengths or any(n < 2 for n in self.lengths) or list(self.lengths) != sorted(set(self.lengths)):
            raise ConfigError(f"--scaling-lengths {list(self.lengths)} must be distinct, ascending and >= 2")
        if min(self.d_model, self.n_layers, self.n_heads, self.mlp_hidden, self.batch, self.repeats) < 1:
            raise ConfigError("the scaling model's sizes, batch and repeats must be positive")
        if self.vocab_size < 4:
            raise ConfigError(f"the scaling model's vocab {self.vocab_size} needs room for mask, EOS and tokens (>= 4)")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError(
                f"--scaling-shape: d_model {self.d_model} must split into {self.n_heads} heads of an even size"
            )

    def model_config(self) -> ModelConfig:
        V = self.vocab_size
        return ModelConfig(
            vocab_size=V, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
            n_kv_heads=self.n_heads, mlp_hidden=self.mlp_hidden, max_seq_len=max(self.lengths),
            mask_id=V - 1, eos_id=V - 2, pad_id=V - 2, bos_id=V - 3,
        )


@dataclass(frozen=True)
class ScalingPoint:
    backend: str
    seq_len: int
    ms: float  # median milliseconds of one denoising step (batch `batch`)
    ms_runs: tuple[float, ...]


@dataclass
class ScalingResult:
    settings: ScalingSettings
    parameters: int
    weights_mb: float  # fp32
    export_seconds: float
    providers: tuple[str, ...]
    points: list[ScalingPoint] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_inputs(cfg: ModelConfig, batch: int, seq_len: int, rng: np.random.Generator) -> np.ndarray:
    """A short random prompt then masks: what a denoising step of a fresh response sees."""
    ids = np.full((batch, seq_len), cfg.mask_id, dtype=np.int64)
    prompt = min(PROMPT_TOKENS, seq_len // 2)
    ids[:, :prompt] = rng.integers(0, cfg.vocab_size - 3, (batch, prompt))
    return ids


def time_steps(backend: Backend, ids: np.ndarray, repeats: int) -> tuple[float, ...]:
    """Milliseconds of `repeats` step calls after one warm-up call (the first call at a shape allocates)."""
    backend.step(StepInput(ids, None))
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.step(StepInput(ids, None))
        runs.append(1e3 * (time.perf_counter() - start))
    return tuple(runs)


def time_window_steps(backend: CacheBackend, ids: np.ndarray, window: int, repeats: int) -> tuple[float, ...]:
    """Milliseconds of `repeats` cached steps over the last `window` columns of ids, against one refresh's keys and
    values (not timed), after one warm-up call."""
    kv = backend.refresh(StepInput(ids, None)).kv
    width = min(window, ids.shape[1])
    start_column = np.full(ids.shape[0], ids.shape[1] - width, dtype=np.int64)
    call = WindowInput(np.ascontiguousarray(ids[:, -width:]), np.ones(ids.shape, np.int64), start_column, kv)
    backend.window_step(call)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.window_step(call)
        runs.append(1e3 * (time.perf_counter() - start))
    return tuple(runs)


def run_scaling(
    settings: ScalingSettings, work_dir: Path, threads: int, progress: Callable[[str], None] = lambda _: None
) -> ScalingResult:
    """Build the random model, export it into `work_dir`, time one step per (backend, length)."""
    from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
    from seer_deploy.export.exporter import export_checkpoint
    from seer_deploy.export.options import ExportOptions
    from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
    from seer_deploy.runtime.torch_backend import TorchBackend
    from seer_deploy.seer.config import SeerConfig

    settings.validate()
    cfg = settings.model_config()
    torch.manual_seed(0)
    model = MaskPredictor(cfg).eval()
    n_params = model.num_parameters()
    progress("scaling: writing and exporting the random model")
    ckpt = save_checkpoint(model, work_dir / "scaling-checkpoint")
    start = time.perf_counter()
    export = export_checkpoint(ckpt, work_dir / "scaling-export",
                               ExportOptions(verify=False, seer=SeerConfig(), kv_cache=True))
    export_seconds = time.perf_counter() - start
    ort = OrtBackend(export.out, OrtSessionOptions(intra_op_threads=threads))
    backends: dict[str, Backend] = {"torch": TorchBackend(model), "ort": ort}
    providers = tuple(getattr(backends["ort"], "providers", ()))
    result = ScalingResult(settings, n_params, round(4 * n_params / 2**20, 1), round(export_seconds, 2), providers)
    rng = np.random.default_rng(0)
    for seq_len in settings.lengths:
        ids = step_inputs(cfg, settings.batch, seq_len, rng)
        for name in SCALING_BACKENDS:
            progress(f"scaling: {name} step at length {seq_len}")
            if name == "ort-window":
                runs = time_window_steps(ort, ids, settings.window, settings.repeats)
            else:
                runs = time_steps(backends[name], ids, settings.repeats)
            result.points.append(ScalingPoint(name, seq_len, round(statistics.median(runs), 3),
                                              tuple(round(r, 3) for r in runs)))
    return result
