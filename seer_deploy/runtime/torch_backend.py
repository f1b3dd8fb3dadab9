"""The torch eager model behind the `Backend` interface: the reference that the exported backends are compared with.

It returns what the exported graphs return (the chosen token, its log-probability, EOS probability and the
sparsity rows), computed the way `reference.generate` computes them, so the runtime loop over this backend gives
the reference loop's tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from seer_deploy.core.backend import Step0Output, StepInput, StepOutput
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.sparsity import SparsityRow, StatsSpec
from seer_deploy.models.confidence import greedy_head, token_log_prob
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.runtime.reference import guided_logits, gumbel_argmax


class TorchBackend:
    """Runs a MaskPredictor in eager mode; step zero reports the MLP statistics of `stats` (default: all layers).

    It is the one backend with the full logits in hand, so it also runs classifier-free guidance
    (`StepInput.guidance`), as the reference loop does: a second pass with the prompt masked.
    """

    name = "torch"
    supports_guidance = True

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
        self.mask_id = cfg.mask_id
        self.sparsity_rows: list[SparsityRow] = self.stats.sparsity_rows
        self._device = next(model.parameters()).device

    def _forward(self, inputs: StepInput, stats: StatsSpec | None) -> tuple[Tensor, Tensor | None]:
        """Logits (guided when inputs.guidance > 0) and, with `stats`, the statistics of the conditional pass."""
        checked = inputs.checked(self.max_seq_len)
        ids = torch.from_numpy(checked.input_ids).to(self._device)
        assert checked.attention_mask is not None  # checked() always gives one
        mask = None if bool(checked.attention_mask.all()) else torch.from_numpy(checked.attention_mask).to(self._device)
        is_prompt = torch.zeros_like(ids, dtype=torch.bool)
        is_prompt[:, : checked.prompt_width] = True
        if mask is not None:
            is_prompt &= mask.bool()
        return guided_logits(self.model, ids, mask, is_prompt, checked.guidance, self.mask_id, stats)

    @torch.inference_mode()
    def step0(self, inputs: StepInput) -> Step0Output:
        """Greedy step zero at full length, with EOS probability and the sparsity rows [B, L*F, S] (layer-major)."""
        logits, stats = self._forward(inputs, self.stats)
        token, confidence, top, log_total = greedy_head(logits)
        eos_prob = torch.exp(logits[..., self.eos_id].float() - top - log_total)
        assert stats is not None  # requested with self.stats
        B, L, Fn, S = stats.shape
        return Step0Output(
            token_ids=_numpy(token, np.int64),
            confidence=_numpy(confidence, np.float32),
            eos_prob=_numpy(eos_prob, np.float32),
            sparsity=_numpy(stats.reshape(B, L * Fn, S), np.float32),
        )

    @torch.inference_mode()
    def step(self, inputs: StepInput) -> StepOutput:
        """x0 (argmax, or LLaDA's Gumbel-max sample seeded by `seed` at temperature > 0) and log softmax(logits)[x0]."""
        logits, _ = self._forward(inputs, None)
        generator = None
        if inputs.temperature > 0:
            generator = torch.Generator(device=logits.device)
            if inputs.seed is None:
                generator.seed()
            else:
                generator.manual_seed(inputs.seed)
        token = gumbel_argmax(logits, inputs.temperature, generator)
        confidence = token_log_prob(logits, token)
        return StepOutput(token_ids=_numpy(token, np.int64), confidence=_numpy(confidence, np.float32))


def _numpy(t: Tensor, dtype: type[np.generic]) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=dtype)
