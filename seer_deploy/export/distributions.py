"""How far an export's output distribution is from torch's at each position, measured relative to the reference's own
spread, so that a flat distribution (a random model, or a real one far from the prompt) and a peaked one are judged
alike.

Absolute measures cannot tell on a flat distribution: with 32,768 tokens of nearly equal probability every token is
within 0.02 of the best and a graph of unrelated noise is "close" in total variation too. Relative ones can:
  * `kl_share`: KL(p || q) / KL(p || uniform), the share of what the reference knows (its distance from knowing
    nothing) that the export loses; for small logit errors it is (error / spread of the logits)^2, for unrelated
    logits of the same spread about 2, for a peaked reference answered by a different peak far above 1;
  * `top_k_overlap`: the share of the reference's k most probable tokens among the export's k (unrelated logits:
    k / V, a few in ten thousand);
  * `share_of_best`: the reference probability of the export's token over the reference's best (1: the same token or
    an exact tie; what decides a peaked position, and says nothing on a flat one: hence the two above);
  * `logit_error`: the root mean square of the difference of centred logits over that of the reference's centred
    logits (the float exports' measure: their logits should match to rounding).
Total variation is recorded beside them (absolute, for the reader).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP_K = 10


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@dataclass(frozen=True)
class Distances:
    """Per position (flattened over every position compared): see the module docstring."""

    kl_share: np.ndarray
    top_k_overlap: np.ndarray
    share_of_best: np.ndarray
    total_variation: np.ndarray
    logit_error: np.ndarray

    @classmethod
    def between(cls, reference: np.ndarray, export: np.ndarray, picked: np.ndarray | None = None) -> Distances:
        """reference, export: logits [N, V] (the export's as float64); picked [N]: the export's tokens (its argmax
        when None)."""
        reference, export = reference.astype(np.float64), export.astype(np.float64)
        log_p, log_q = log_softmax(reference), log_softmax(export)
        p = np.exp(log_p)
        vocab = reference.shape[-1]
        kl = (p * (log_p - log_q)).sum(-1)
        spread = np.maximum((p * log_p).sum(-1) + np.log(vocab), 1e-300)  # KL(p || uniform)
        k = min(TOP_K, vocab)
        top_ref = np.argpartition(-reference, k - 1, axis=-1)[:, :k]
        top_exp = np.argpartition(-export, k - 1, axis=-1)[:, :k]
        overlap = np.array([len(np.intersect1d(a, b)) for a, b in zip(top_ref, top_exp, strict=True)]) / k
        tokens = export.argmax(-1) if picked is None else picked
        best = np.take_along_axis(p, tokens[:, None], axis=-1)[:, 0] / p.max(-1)
        centred_ref = reference - reference.mean(-1, keepdims=True)
        centred_diff = export - export.mean(-1, keepdims=True) - centred_ref
        logit_error = np.sqrt((centred_diff**2).mean(-1) / np.maximum((centred_ref**2).mean(-1), 1e-300))
        tv = 0.5 * np.abs(p - np.exp(log_q)).sum(-1)
        return cls(np.maximum(kl, 0.0) / spread, overlap, best, tv, logit_error)

    @classmethod
    def joined(cls, parts: list[Distances]) -> Distances:
        fields = ("kl_share", "top_k_overlap", "share_of_best", "total_variation", "logit_error")
        return cls(*(np.concatenate([getattr(part, f) for part in parts]) for f in fields))

    def summary(self) -> dict[str, float]:
        """The figures a manifest records (means over positions, and the worst)."""
        return {
            "kl share (mean)": float(self.kl_share.mean()),
            "kl share (max)": float(self.kl_share.max(initial=0.0)),
            f"top-{TOP_K} overlap (mean)": float(self.top_k_overlap.mean()),
            "total variation (mean)": float(self.total_variation.mean()),
            "logit error (mean)": float(self.logit_error.mean()),
            "logit error (max)": float(self.logit_error.max(initial=0.0)),
            "positions compared": float(self.kl_share.size),
        }


@dataclass(frozen=True)
class ProbeLogits:
    """An export's logits on one probe (export.validation_twin): step zero over every column [B, S, V]; the window
    step over the probe's last columns [B, W, V] (None without a cache graph)."""

    step0: np.ndarray
    window: np.ndarray | None


def rows(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """values [B, S, ...] at the positions where `where` [B, S] holds -> [N, ...]."""
    return values[where.astype(bool)]
