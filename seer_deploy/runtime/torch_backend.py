"""The torch eager model behind the `Backend` interface: the reference that the exported backends are compared with.

It returns what the exported graphs return (the chosen token, its log-probability, EOS probability and the
sparsity rows), computed the way `reference.generate` computes them, so the runtime loop over this backend gives
the reference loop's tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from seer_deploy.core.backend import Step0Output, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec
from seer_deploy.models.confidence import greedy_head, token_log_prob
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.runtime.reference import gumbel_argmax


class TorchBackend:
    """Runs a MaskPredictor in eager mode; step zero reports the MLP statistics of `stats` (default: all layers)."""

    name = "torch"

    def __init__(self, model: MaskPredictor, stats: StatsSpec | None = None) -> None:
        cfg = model.cfg
        self.stats = stats if stats is not None else StatsSpec(layers=tuple(range(cfg.n_layers)))
        bad = [layer for layer in self.stats.layers if not 0 <= layer < cfg.n_layers]
        if bad or len(set(self.stats.layers)) != len(self.stats.layers):
            raise ConfigError(
                f"stats layers {list(self.stats.layers)} must be distinct layers of the model's {cfg.n_layers} "
                f"(0..{cfg.n_layers - 1})"
            )
        self.model = model.eval()
        self.max_seq_len = cfg.max_seq_len
        self.eos_id = cfg.eos_id
        # Row l * len(STAT_NAMES) + f of the sparsity output is statistic f of the l-th requested layer.
        self.sparsity_rows: list[tuple[int, str]] = [(layer, s) for layer in self.stats.layers for s in STAT_NAMES]
        self._device = next(model.parameters()).device

    def _inputs(self, input_ids: np.ndarray, attention_mask: np.ndarray | None) -> tuple[Tensor, Tensor | None]:
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ConfigError(f"input_ids must be an integer array [B, S], got {ids.dtype} with shape {ids.shape}")
        if ids.shape[1] > self.max_seq_len:
            raise ConfigError(
                f"a step of {ids.shape[1]} positions exceeds the model's {self.max_seq_len}; shorten the prompt "
                f"or lower gen_length"
            )
        mask = None
        if attention_mask is not None:
            if np.shape(attention_mask) != ids.shape:
                raise ConfigError(f"attention_mask has shape {np.shape(attention_mask)} but input_ids {ids.shape}")
            mask = torch.from_numpy(np.asarray(attention_mask, dtype=np.int64)).to(self._device)
        return torch.from_numpy(ids.astype(np.int64, copy=False)).to(self._device), mask

    @torch.inference_mode()
    def step0(self, input_ids: np.ndarray, attention_mask: np.ndarray | None) -> Step0Output:
        """Greedy step zero at full length, with EOS probability and the sparsity rows [B, L*F, S] (layer-major)."""
        ids, mask = self._inputs(input_ids, attention_mask)
        out = self.model(ids, mask, stats=self.stats)
        token, confidence, top, log_total = greedy_head(out.logits)
        eos_prob = torch.exp(out.logits[..., self.eos_id].float() - top - log_total)
        assert out.stats is not None  # requested with stats=self.stats
        B, L, Fn, S = out.stats.shape
        return Step0Output(
            token_ids=_numpy(token, np.int64),
            confidence=_numpy(confidence, np.float32),
            eos_prob=_numpy(eos_prob, np.float32),
            sparsity=_numpy(out.stats.reshape(B, L * Fn, S), np.float32),
        )

    @torch.inference_mode()
    def step(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> StepOutput:
        """x0 (argmax, or LLaDA's Gumbel-max sample seeded by `seed` at temperature > 0) and log softmax(logits)[x0]."""
        ids, mask = self._inputs(input_ids, attention_mask)
        logits = self.model(ids, mask).logits
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=logits.device)
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(seed)
        token = gumbel_argmax(logits, temperature, generator)
        confidence = token_log_prob(logits, token)
        return StepOutput(token_ids=_numpy(token, np.int64), confidence=_numpy(confidence, np.float32))


def _numpy(t: Tensor, dtype: type[np.generic]) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=dtype)
