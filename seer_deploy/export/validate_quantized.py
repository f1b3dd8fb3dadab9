"""The check of a quantized export (`export --quantize`): the export's output distributions against the float32 torch
model's on the probe prompts, measured relative to each reference distribution's spread (export.distributions), and
the tokens its served graphs pick, against bounds stated per scheme.

Quantized weights move every logit, so the full-precision check's tolerances (a few 1e-4 of probability) cannot hold;
what a user needs to know is whether the model still computes the same distributions. The logits come from the
export's validation twin (export.validation_twin: the same graphs with the LM head's logits as one more output, never
installed) at every real position of step zero and over the window step; the served graphs' own tokens (step zero,
a step over the response, the window step) are scored by the reference probability they get as a share of the best.
Each measure must hold its bound:
  * mean KL share <= max_kl_share: a graph of unrelated noise loses all of it (1 to 2 on flat outputs, more on
    peaked ones), an honest one well under 0.01 at int8 and up to a quarter at int4 on a tiny random model;
  * mean top-10 overlap >= min_top_k_overlap: unrelated noise shares next to none of the reference's top tokens;
  * the share of tokens whose reference probability is at least `share_of_best` of the best >= min_agreement: a
    peaked model's answers (near-ties either way are not disagreements).
  * the logits against torch running the export's own quantized numbers (export.quantized_reference), error over
    their spread <= OWN_SCHEME_RTOL: rounding only, where the bounds above must leave room for what the scheme
    costs (an honest int4 export and a small model with one projection replaced move the logits alike).
Flat outputs (a random model; a real one at masked positions far from the prompt) pass the token rule on any graph,
which is why the others exist; the figures and the bounds are recorded in the manifest either way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import cast

import numpy as np

from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.backend import (
    Backend,
    CacheBackend,
    PromptCacheBackend,
    StepInput,
    supports_cache,
    supports_prompt_cache,
    window_lead,
)
from seer_deploy.export.distributions import TOP_K, Distances, ProbeLogits, log_softmax, rows
from seer_deploy.export.validate import (
    ExportValidationError,
    ProbeReference,
    probe_prompt_run,
    probe_window,
    response_candidates,
)


@dataclass(frozen=True)
class DistributionBound:
    max_kl_share: float  # mean over positions of KL(p || q) / KL(p || uniform)
    min_top_k_overlap: float  # mean share of the reference's top-10 tokens among the export's
    share_of_best: float  # a token agrees when its reference probability is at least this share of the best
    min_agreement: float  # the share of the served graphs' tokens that must agree


# What the formats cost, measured on honest exports (the demo, demo-vl, the flat and peaked models of
# tests/faults.py, the tiny random family checkpoints at blocks of 16): int8 (a step of 1/128 of each block's largest
# weight) KL share at most 0.007, top-10 overlap at least 0.97; int4 (1/8) KL share up to 0.27 (MMaDA's tiny random
# model: logits moved by 0.43 of their spread), top-10 overlap at least 0.77. A graph that computes something else
# loses all of it: KL share 1 to 4, top-10 overlap near 0. The bounds sit between, nearer the honest side.
BOUNDS: dict[str, DistributionBound] = {
    "int8": DistributionBound(max_kl_share=0.02, min_top_k_overlap=0.8, share_of_best=0.5, min_agreement=0.95),
    "int4": DistributionBound(max_kl_share=0.5, min_top_k_overlap=0.5, share_of_best=0.25, min_agreement=0.8),
}
# The export against torch running the same quantized numbers: rounding only (measured up to 0.028 of the logits'
# spread, mean over positions, on the tiny random family checkpoints; 0.006 on the demos). One projection of the
# flat model replaced by noise moves them by 0.13.
OWN_SCHEME_RTOL = 0.05


class _Tokens:
    """The served graphs' tokens scored against the reference: agreeing (at least share_of_best of the best) and
    exactly the argmax."""

    def __init__(self, bound: DistributionBound) -> None:
        self.bound = bound
        self.agree = self.exact = self.total = 0

    def add(self, log_probs: np.ndarray, token_ids: np.ndarray, real: np.ndarray) -> None:
        """log_probs [B, S, V] of the reference, the tokens picked [B, S], which positions count [B, S]."""
        token_ids = np.where(real, token_ids, 0)  # a column left out returns its input id (an image's may lie past V)
        picked = np.take_along_axis(log_probs, token_ids[..., None], axis=-1)[..., 0]
        share = np.exp(picked - log_probs.max(-1))
        self.agree += int(((share >= self.bound.share_of_best) & real).sum())
        self.exact += int(((token_ids == log_probs.argmax(-1)) & real).sum())
        self.total += int(real.sum())


def compare_quantized(backend: Backend, refs: list[ProbeReference], quant: Quantization, logits: list[ProbeLogits],
                      own: list[ProbeReference]) -> dict[str, float]:
    """The export's distributions (`logits`, from its validation twin) against float32 torch and against torch in the
    export's own scheme (`own`: export.quantized_reference), and its served graphs' tokens against float32 torch, on
    every probe; ExportValidationError past any of the bounds. Returns the figures the manifest records."""
    bound = BOUNDS[quant.scheme]
    tokens = _Tokens(bound)
    distances: list[Distances] = []
    rounding: list[np.ndarray] = []
    sparsity: list[np.ndarray] = []
    for ref, got, mine in zip(refs, logits, own, strict=True):
        p = ref.probe
        log_probs = log_softmax(ref.logits)
        real = p.attention_mask.astype(bool)
        distances.append(Distances.between(rows(ref.logits, real), rows(got.step0, real)))
        rounding.append(Distances.between(rows(mine.logits, real), rows(got.step0, real)).logit_error)
        s0 = backend.step0(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width))
        tokens.add(log_probs, s0.token_ids, real)
        sparsity.append(np.abs(s0.sparsity.astype(np.float64) - ref.stats).ravel())
        cols = response_candidates(p)
        step = backend.step(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width, candidates=cols))
        in_response = np.zeros_like(real)
        np.put_along_axis(in_response, cols, True, axis=1)
        tokens.add(log_probs, step.token_ids, real & in_response)
        if supports_cache(backend):
            window_tokens = _window_tokens(cast(CacheBackend, backend), ref)
            W = window_tokens.shape[1]
            window_real = real[:, -W:]
            if got.window is not None:
                distances.append(Distances.between(rows(ref.logits[:, -W:], window_real), rows(got.window, window_real)))
                rounding.append(Distances.between(rows(mine.logits[:, -W:], window_real),
                                                  rows(got.window, window_real)).logit_error)
            tokens.add(log_probs[:, -W:], window_tokens, window_real)
        if supports_prompt_cache(backend):
            P = p.prompt_width
            out = cast(PromptCacheBackend, backend).prompt_step(probe_prompt_run(p, ref.kv, backend))
            tokens.add(log_probs[:, P:], out.token_ids[:, 1:], real[:, P:])
    measured = Distances.joined(distances)
    moved = np.concatenate(sparsity)
    off_own = np.concatenate(rounding)
    figures = {
        **measured.summary(),
        "logit error against the scheme in torch (mean)": float(off_own.mean()),
        "logit error against the scheme in torch (max)": float(off_own.max(initial=0.0)),
        "token agreement": tokens.agree / max(tokens.total, 1),
        "exact token agreement": tokens.exact / max(tokens.total, 1),
        "positions": float(tokens.total),
        **{f"bound: {name.replace('_', ' ')}": value for name, value in asdict(bound).items()},
        "bound: max logit error against the scheme in torch (mean)": OWN_SCHEME_RTOL,
        "sparsity max |diff|": float(moved.max(initial=0.0)),
        "sparsity mean |diff|": float(moved.mean()) if moved.size else 0.0,
    }
    problems = _problems(figures, bound)
    if problems:
        raise ExportValidationError(
            f"the {quant.describe()} graphs compute other distributions than torch: {'; '.join(problems)} "
            f"(over {int(figures['positions compared'])} positions; unrelated logits give a KL share near 2 and no "
            f"top-{TOP_K} overlap); export with --quantize int8, a smaller --block-size or --keep-head", figures)
    return figures


def _window_tokens(backend: CacheBackend, ref: ProbeReference) -> np.ndarray:
    """The window step's tokens over the probe's last columns (validate.probe_window), against the keys and values a
    refresh returned."""
    p = ref.probe
    refreshed = backend.refresh(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width,
                                          candidates=response_candidates(p)))
    lead = window_lead(backend)
    return backend.window_step(probe_window(p, refreshed.kv, backend)).token_ids[:, lead:]


def _problems(figures: dict[str, float], bound: DistributionBound) -> list[str]:
    """Each bound the figures miss, in words."""
    problems = []
    own = figures["logit error against the scheme in torch (mean)"]
    if not own <= OWN_SCHEME_RTOL:
        problems.append(f"the logits are {own:.3g} of their spread away from torch running the same quantized weights "
                        f"(mean; bound {OWN_SCHEME_RTOL}: rounding only)")
    if not figures["kl share (mean)"] <= bound.max_kl_share:
        problems.append(f"mean KL share {figures['kl share (mean)']:.3g} > {bound.max_kl_share}")
    overlap = figures[f"top-{TOP_K} overlap (mean)"]
    if not overlap >= bound.min_top_k_overlap:
        problems.append(f"mean top-{TOP_K} overlap {overlap:.1%} < {bound.min_top_k_overlap:.0%}")
    if not figures["token agreement"] >= bound.min_agreement:
        problems.append(f"the same token (at least {bound.share_of_best:.0%} of the best's probability) at "
                        f"{figures['token agreement']:.1%} of {int(figures['positions'])} positions < "
                        f"{bound.min_agreement:.0%}")
    return problems
