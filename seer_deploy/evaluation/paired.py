"""The difference between two modes' scores on the same documents, with a paired confidence interval.

Paired, because both modes answered the same documents: the interval is for the mean of per-document differences,
much tighter than comparing two independent means when most answers agree. A percentile bootstrap over documents
(seeded: the same scores give the same interval) is used, as lm-evaluation-harness uses the bootstrap for its own
standard errors; it needs no normality, which per-document 0/1 scores do not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PairedDifference:
    mean: float  # mean over documents of (mode score - baseline score)
    low: float  # the confidence interval's ends
    high: float
    documents: int
    confidence: float

    def to_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "documents": self.documents,
                "confidence": self.confidence}


def paired_difference(scores: Sequence[float], baseline: Sequence[float], confidence: float = 0.95,
                      resamples: int = 2000, seed: int = 0) -> PairedDifference:
    """mean(scores - baseline) and its paired percentile-bootstrap interval; ValueError for unpaired inputs."""
    if len(scores) != len(baseline):
        raise ValueError(f"paired scores need the same documents: {len(scores)} against {len(baseline)}")
    if not scores:
        raise ValueError("no documents to compare")
    d = np.asarray(scores, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(d), size=(resamples, len(d)))
    means = d[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return PairedDifference(float(d.mean()), float(low), float(high), len(d), confidence)
