"""The check of a quantized export (`export --quantize`): token agreement with the float32 torch model on the probe
prompts, against a stated bound per scheme.

Quantized weights move every logit, so the full-precision check's tolerances (a few 1e-4 of probability) cannot hold;
what a user needs to know is whether the model still picks the same tokens. A position agrees when the token ONNX
Runtime picks has a reference probability within `prob_atol` of the reference's best (a near-tie either way is not a
disagreement), over every real position of step zero, of the greedy rows of a step over the response, and of the
window step with the cache. The share must reach `min_agreement`; the exact share (argmax equal) and how far the
sparsity statistics moved are recorded beside it. A graph that computes something else agrees on a few per cent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.backend import (
    Backend,
    CacheBackend,
    PromptCacheBackend,
    PromptInput,
    StepInput,
    WindowInput,
    supports_cache,
    supports_prompt_cache,
    window_lead,
)
from seer_deploy.export.validate import ExportValidationError, ProbeReference, response_candidates


@dataclass(frozen=True)
class AgreementBound:
    prob_atol: float  # a token agrees when its reference probability is within this of the best
    min_agreement: float  # the share of positions that must agree


# Stated, not tuned to pass: int8's per-weight error (0.005 of the largest weight) moves probabilities by well under
# 0.02 on the demo; int4's (0.086) by more, and a few flips at 4 bits are what the format costs.
BOUNDS: dict[str, AgreementBound] = {"int8": AgreementBound(0.02, 0.98), "int4": AgreementBound(0.05, 0.90)}


class _Tally:
    def __init__(self, bound: AgreementBound) -> None:
        self.bound = bound
        self.agree = self.exact = self.total = 0

    def add(self, probs: np.ndarray, token_ids: np.ndarray, real: np.ndarray) -> None:
        """probs [B, S, V] of the reference, the tokens picked [B, S], which positions count [B, S]."""
        token_ids = np.where(real, token_ids, 0)  # a column left out returns its input id (an image's may lie past V)
        picked = np.take_along_axis(probs, token_ids[..., None], axis=-1)[..., 0]
        self.agree += int(((picked >= probs.max(-1) - self.bound.prob_atol) & real).sum())
        self.exact += int(((token_ids == probs.argmax(-1)) & real).sum())
        self.total += int(real.sum())


def compare_quantized(backend: Backend, refs: list[ProbeReference], quant: Quantization) -> dict[str, float]:
    """Token agreement of the quantized graphs with float32 torch on every probe; ExportValidationError below the
    scheme's bound. Returns the figures the manifest records."""
    bound = BOUNDS[quant.scheme]
    tally = _Tally(bound)
    sparsity: list[np.ndarray] = []
    for ref in refs:
        p = ref.probe
        probs = _softmax(ref.logits)
        real = p.attention_mask.astype(bool)
        s0 = backend.step0(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width))
        tally.add(probs, s0.token_ids, real)
        sparsity.append(np.abs(s0.sparsity.astype(np.float64) - ref.stats).ravel())
        cols = response_candidates(p)
        step = backend.step(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width, candidates=cols))
        in_response = np.zeros_like(real)
        np.put_along_axis(in_response, cols, True, axis=1)
        tally.add(probs, step.token_ids, real & in_response)
        if supports_cache(backend):
            cache = cast(CacheBackend, backend)
            refreshed = cache.refresh(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width,
                                                candidates=cols))
            B, S = p.input_ids.shape
            W = max(1, S // 3)
            lead = window_lead(backend)  # shifted logits: the window starts one column before what it predicts
            window = cache.window_step(WindowInput(p.input_ids[:, S - W - lead:], p.attention_mask,
                                                   np.full(B, S - W - lead, dtype=np.int64), refreshed.kv,
                                                   prompt_width=p.prompt_width))
            tally.add(probs[:, S - W:], window.token_ids[:, lead:], real[:, S - W:])
        if supports_prompt_cache(backend):
            P = p.prompt_width
            run = p.input_ids[:, P - 1:]
            out = cast(PromptCacheBackend, backend).prompt_step(PromptInput(
                run, p.attention_mask, np.ascontiguousarray(ref.kv[:, :, :, :, : P - 1]), prompt_width=P))
            tally.add(probs[:, P:], out.token_ids[:, 1:], real[:, P:])
    moved = np.concatenate(sparsity)
    figures = {
        "token agreement": tally.agree / max(tally.total, 1),
        "exact token agreement": tally.exact / max(tally.total, 1),
        "positions": float(tally.total),
        "bound: min agreement": bound.min_agreement,
        "bound: near-tie probability": bound.prob_atol,
        "sparsity max |diff|": float(moved.max(initial=0.0)),
        "sparsity mean |diff|": float(moved.mean()) if moved.size else 0.0,
    }
    if figures["token agreement"] < bound.min_agreement:
        raise ExportValidationError(
            f"the {quant.describe()} graphs agree with torch on {figures['token agreement']:.1%} of "
            f"{tally.total} token positions, below the bound of {bound.min_agreement:.0%} for {quant.scheme} (a token "
            f"agrees within {bound.prob_atol} of the best probability); export with --quantize int8, a smaller "
            "--block-size or --keep-head", figures)
    return figures


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)
